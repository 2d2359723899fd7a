"""core/versions.calls: a fix that reached a library between releases is found in what its code calls."""

import functools

from colo_shim.core.versions import calls


def plain_closure(func):  # NeMo-RL's wrap_with_nvtx_name: no functools.wraps, no __wrapped__
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


def kept(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


class Fixed:
    @plain_closure
    def offload(self):
        self.finalize_async_save()
        self.move("cpu")

    @kept
    def kept_offload(self):
        self.finalize_async_save()

    def nested(self):
        def inner():
            return self.finalize_async_save()

        return inner()

    def finalize_async_save(self):
        pass

    def move(self, device):
        pass


class Window:  # main from #2828 to #3322: the method exists, the offload never calls it
    @plain_closure
    def offload(self):
        self.move("cpu")

    def finalize_async_save(self):
        pass

    def move(self, device):
        pass


def test_calls_sees_through_decorators_and_nested_code():
    assert calls(Fixed.offload, "finalize_async_save")
    assert calls(Fixed.kept_offload, "finalize_async_save")
    assert calls(Fixed.nested, "finalize_async_save")
    assert calls(Fixed().offload, "finalize_async_save")  # a bound method


def test_a_method_that_exists_is_not_a_call():
    assert not calls(Window.offload, "finalize_async_save")
    assert calls(Window.offload, "move")
    assert not calls(None, "finalize_async_save") and not calls(len, "finalize_async_save")


def test_depth_bounds_the_walk():
    deep = Fixed.offload
    for _ in range(4):
        deep = plain_closure(deep)
    assert not calls(deep, "finalize_async_save") and calls(deep, "finalize_async_save", depth=6)
