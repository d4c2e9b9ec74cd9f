"""Awaited framework calls: results, exceptions and the order of calls across tasks."""

import asyncio

import fakeapi as fa


async def main():
    first = await fa.nap(1)
    both = await asyncio.gather(fa.nap(2), fa.nap(3, seconds=0.002))
    try:
        await fa.aboom(4)
    except ValueError as exc:
        print("caught", exc)
    print(first, both, [await fa.nap(x) for x in range(2)])
    print(fa.LOG)


asyncio.run(main())
