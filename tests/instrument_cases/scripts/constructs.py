"""Every construct the instrumenter must keep working, each touching the fake API."""

from __future__ import annotations

import asyncio
import json
import math as m

import fakeapi as fa
from fakeapi import Thing, decorate
from fakeapi import f as eff

COUNTER = 0


def nested_and_starred(*args, **kwargs):
    # nested calls, * and ** arguments, keywords
    return fa.f(fa.g(1, *args), k=fa.g(**kwargs), **{"z": fa.g()})


def comprehensions():
    squares = [fa.g(i) for i in range(3) if fa.g(i) % 2]
    table = {fa.g(k): fa.f(k) for k in "ab"}
    total = sum(fa.g(i) for i in range(2))
    return squares, table, total, fa.f(x * 2 for x in range(3))


def lambdas_and_defaults(scale=fa.g("default")):  # noqa: B008 - the construct under test
    twice = lambda v, w=fa.g("lambda default"): fa.g(v, w) * 2  # noqa: E731, B008
    return twice(scale)


@decorate("jit")
def decorated():
    return decorated.tag


def generator(n):
    for i in range(n):
        yield fa.g(i)
    return fa.g("done")


async def coroutine(x):
    await asyncio.sleep(0)
    return fa.g(x, await asyncio.sleep(0, result=fa.g("awaited")))


class Base(fa.Layer):
    scale = fa.g("class body")

    def __init__(self):
        super().__init__()
        self.inner = fa.Thing(7)

    def forward(self, x):
        return self.inner(x) + self.scale


def walrus_and_conditions(values):
    if (n := fa.g(*values)) > 0 and fa.g(n):  # noqa: SIM108 - a statement-level condition
        kind = "pos"
    else:
        kind = "neg"
    while fa.g("loop") < 0:
        pass
    return n, kind, fa.g(1) if m.sqrt(4) == 2 else fa.g(2)


def scopes():
    global COUNTER
    COUNTER = fa.g("global")
    inner_value = fa.g("outer")

    def bump():
        nonlocal inner_value
        inner_value = fa.g(inner_value)
        return inner_value

    return bump(), COUNTER


def strings_and_with(path):
    with open(path, "w") as handle, fa.Thing(1) and open(path, "a") as more:
        handle.write(f"{fa.g('fstring')!r:>8}|{json.dumps({'a': fa.g(1)})}\n")
        more.write(f"{fa.f('x').m(1)}\n")
    with open(path) as handle:
        return handle.read().splitlines()


def chained():
    thing = fa.f(1)
    again = eff(2).m(3).m(4)
    return thing.m(fa.g()), again(5), Thing(9).m()


def main():
    print(nested_and_starred(1, 2, key=3))
    print(comprehensions())
    print(lambdas_and_defaults(), decorated())
    print(list(generator(2)))
    print(asyncio.run(coroutine(5)))
    layer = Base()
    print(layer(3), layer.fit(4))
    print(walrus_and_conditions([1, 2]))
    print(scopes())
    print(strings_and_with("out.txt"))
    print(chained())
    try:
        fa.boom(fa.g("before"))
    except ValueError as error:
        print("caught", error)
    print("\n".join(fa.LOG))


if __name__ == "__main__":
    main()
