"""The module the test family patches; one callable of every kind a family wraps."""


class Engine:
    def step(self, x):
        return x + 1

    @classmethod
    def build(cls, x):
        return x * 2

    @staticmethod
    def helper(x):
        return x - 1

    async def step_async(self, x):
        return x + 10


def free(a, b=2, *, c=3):
    return a + b + c


async def free_async(x):
    return x
