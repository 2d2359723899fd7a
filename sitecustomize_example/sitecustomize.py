# colo-shim activation for a sitecustomize.py you manage yourself (paste this block at its end).
# Inert unless COLO_SHIM is set: one environment lookup, nothing imported, nothing run from the
# environment. Where colo-shim is not importable it stays silent.
import os as _colo_shim_os

if _colo_shim_os.environ.get("COLO_SHIM", "").strip().lower() not in ("", "0", "off", "false", "no"):
    try:
        from colo_shim._activate import activate as _colo_shim_activate
    except ImportError:
        pass
    else:
        _colo_shim_activate()
        del _colo_shim_activate
del _colo_shim_os
