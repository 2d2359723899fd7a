"""Worker-side write wrapper (pickled by reference into the NVRx worker): the write starts only
once the trainer has created `gate`, so a test orders "in flight" events without timing them."""

import functools
import os
import time


def gated(request, gate):
    """An NVRx AsyncRequest (cli/saver.request()) whose write waits for `gate`; queue it as it is."""
    return request._replace(async_fn=functools.partial(wait_then_write, gate, request.async_fn))


def wait_then_write(gate, write_fn, *args, **kwargs):
    while not os.path.exists(gate):
        time.sleep(0.005)
    return write_fn(*args, **kwargs)
