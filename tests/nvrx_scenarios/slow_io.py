"""Worker-side write wrapper for the scenarios (pickled by reference into the NVRx worker).

"sleep" holds the write open so a test can kill the worker or hit the fence timeout while a save
is pending; "break" turns the checkpoint directory into a file so NVRx's own writer fails and
reports the error through its results queue, as a full disk or lost mount would.
"""

import functools
import shutil
import time


def slowed(request, mode, seconds, path):
    """An NVRx AsyncRequest (cli/saver.request()) whose write goes through wrapped_write first."""
    return request._replace(async_fn=functools.partial(wrapped_write, mode, seconds, path, request.async_fn))


def wrapped_write(mode, seconds, path, write_fn, *args, **kwargs):
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "break":
        shutil.rmtree(path, ignore_errors=True)
        with open(path, "w") as f:
            f.write("not a directory")
    return write_fn(*args, **kwargs)
