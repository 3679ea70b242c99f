"""`free_port`: ports for servers that start later must not be ones outgoing connections take."""

import socket

from mutualrl.see.server import _ephemeral_range, free_port


def test_ports_are_distinct_below_the_ephemeral_range_and_bindable():
    low, _ = _ephemeral_range()
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == 100
    assert all(p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_never_handed_out():
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        assert all(free_port() != taken for _ in range(300))
