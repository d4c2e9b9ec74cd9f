"""Uses framework subclasses and objects imported from another module of the project."""

import crossmodule_model as cm
from crossmodule_model import Net, encoder

net = Net()
print(net(2))
print(net.fit(1))
print(net.scale(3))
print(encoder.m(1))
print(cm.Net()(5))
