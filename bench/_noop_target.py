"""Target module for bench_overhead: no-op callables, so the timing is the wrapper's alone."""


class Service:
    def method(self):
        return None


def function():
    return None
