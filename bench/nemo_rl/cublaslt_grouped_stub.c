/* Transformer Engine 2.15's cu13 wheel (NeMo-RL main's pin) links cublasLtGroupedMatrixLayoutInit_internal, which
 * cuBLAS 13.1 (the cuBLAS of the GPU machine's torch 2.11 / CUDA 13.0 image) does not export, so the library fails
 * to load at all. That function only serves TE's grouped GEMM (MoE experts); the dense model of this bench never
 * calls it. device.sh builds this file and preloads it only when the machine's libcublasLt lacks the symbol:
 * the definition carries cuBLAS's own version node so the versioned reference binds, and a call says it is a stub
 * by returning CUBLAS_STATUS_NOT_SUPPORTED (15) and printing one line. */
#include <stdio.h>

int cublasLtGroupedMatrixLayoutInit_internal(void *layout, unsigned long size, int type, int count,
                                             const void *rows, const void *cols, const void *ld) {
    (void)layout; (void)size; (void)type; (void)count; (void)rows; (void)cols; (void)ld;
    fprintf(stderr, "colo-shim bench: cublasLtGroupedMatrixLayoutInit_internal is a stub (cuBLAS here < 13.2)\n");
    return 15;
}
