"""Worker-side write wrapper (pickled by reference into the NVRx worker): the write starts only
once the trainer has created `gate`, so a test orders "in flight" events without timing them."""

import os
import time


def wait_then_write(gate, write_fn, *args, **kwargs):
    while not os.path.exists(gate):
        time.sleep(0.005)
    return write_fn(*args, **kwargs)
