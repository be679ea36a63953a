"""Tools on top of the node: the local multi-process swarm launcher, the protocol checker and
test-vector writer, the protobuf generator. Nothing below the command line imports them."""
