# A comment first, then objects returned by framework calls, subclasses and chains.
import fakeapi


class Net(fakeapi.Layer):
    def __init__(self, width):
        super().__init__()
        self.width = width
        self.head = fakeapi.Thing(width)

    def forward(self, x):
        return [self.head(x), fakeapi.g(x, self.width)]


def build(width=3):
    model = Net(width)
    return model


def train(model, data):
    return model.fit(data), model(data)


net = build()
print(train(net, [1, 2]))
print(fakeapi.f(1).m(2).m(fakeapi.g(3))(4))
print(*fakeapi.LOG, sep="\n")
