"""A loopback TCP proxy in front of the store that adds the network's faults to its replies.

It is tests/support/tcp_proxy.py's proxy (forward, drop_replies, black_hole), whose `_reply` it extends
with three more modes, each acting on what the store sends back:
- "delay": every reply waits `delay` seconds before it is passed on (latency above the budget);
- "loss": each reply is held `loss_pause` seconds with probability `loss`, what a lost TCP segment
  costs on loopback (the retransmission after Linux's minimum retransmission timeout, 200 ms): TCP
  never hands a reader a gap, so a loss is a late reply, never a missing one;
- "reset": with probability `resets`, the first half of a reply is passed on, then both connections
  are reset (RST): a connection reset mid-reply.
"""

from __future__ import annotations

import random
import socket
import struct
import time

from tests.support.tcp_proxy import TcpProxy

#: What a lost segment costs on loopback: Linux's minimum retransmission timeout.
LOSS_PAUSE = 0.2


class FaultProxy(TcpProxy):
    """A TcpProxy with the modes "delay", "loss" and "reset" (see the module docstring)."""

    keep_sent = False  # a fault run sends far too much to keep it all

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.delay = 0.0
        self.loss = 0.0
        self.loss_pause = LOSS_PAUSE
        self.resets = 1.0
        self._random = random.Random(20240601)  # the same losses for the same traffic
        super().__init__(upstream_host, upstream_port)

    def _reply(self, client: socket.socket, upstream: socket.socket, data: bytes) -> bool:
        """Pass a reply of the store on as the mode says; False when the connections were reset."""
        mode = self.mode
        if mode in ("drop_replies", "black_hole"):
            return True
        if mode == "delay":
            time.sleep(self.delay)
        elif mode == "loss" and self._random.random() < self.loss:
            time.sleep(self.loss_pause)
        elif mode == "reset" and self._random.random() < self.resets:
            client.sendall(data[: max(len(data) // 2, 1)])
            for sock in (client, upstream):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        client.sendall(data)
        return True
