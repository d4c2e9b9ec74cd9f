"""An exception from inside a wrapped call propagates unchanged, through user frames."""

import fakeapi as fa


def level_two(x):
    return fa.g(x) + fa.boom(
        x,
    )


def level_one():
    values = [fa.g(i) for i in range(2)]
    return level_two(values)


print("start", fa.f(1))
level_one()
print("never printed")
