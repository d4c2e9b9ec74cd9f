"""Classes and objects used by crossmodule.py: framework subclasses defined in another module."""

import fakeapi as fa


class Base(fa.Layer):
    def scale(self, x):
        return x * 2


class Net(Base):
    def forward(self, x):
        return self.scale(x)


encoder = fa.Thing(3)
