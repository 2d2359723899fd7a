"""Worker-side write wrapper for the scenarios (pickled by reference into the NVRx worker).

"sleep" holds the write open so a test can kill the worker or hit the fence timeout while a save
is pending; "break" turns the checkpoint directory into a file so NVRx's own writer fails and
reports the error through its results queue, as a full disk or lost mount would.
"""

import shutil
import time


def wrapped_write(mode, seconds, path, write_fn, *args, **kwargs):
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "break":
        shutil.rmtree(path, ignore_errors=True)
        with open(path, "w") as f:
            f.write("not a directory")
    return write_fn(*args, **kwargs)
