"""The server side of RFC 6455 WebSockets, just enough for ``v5.channel.k8s.io`` (``kubectl exec``).

Since Kubernetes 1.36 the apiserver passes a client's WebSocket exec stream straight through to a
kubelet whose Node declares ``ExtendWebSocketsToKubelet`` (status.declaredFeatures), instead of
translating it to SPDY. The node agent declares it and terminates the WebSocket here: the opening
handshake, masked client frames (fragmented messages reassembled), ping/pong, close, and binary
messages out. No extensions (no permessage-deflate: it is not offered to the kubelet either).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import struct
import threading

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class ConnectionClosed(Exception):
    pass


def accept_key(client_key: str) -> str:
    return base64.b64encode(hashlib.sha1((client_key + _GUID).encode()).digest()).decode()


class WebSocket:
    """A server-side connection over an already upgraded socket (thread-safe sends)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self.closed = False

    def _recv_exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionClosed("peer closed the connection")
            data += chunk
        return data

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytes([0x80 | opcode])
        length = len(payload)
        if length < 126:
            header += bytes([length])
        elif length < 1 << 16:
            header += bytes([126]) + struct.pack("!H", length)
        else:
            header += bytes([127]) + struct.pack("!Q", length)
        with self._send_lock:
            if self.closed:
                raise ConnectionClosed("connection already closed")
            self.sock.sendall(header + payload)

    def send_binary(self, payload: bytes) -> None:
        self._send_frame(OP_BINARY, payload)

    def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(OSError, ConnectionClosed):
            self._send_frame(OP_CLOSE, struct.pack("!H", code) + reason.encode())
        self.closed = True

    def receive(self) -> bytes:
        """The next data message (pings answered, pongs skipped); ConnectionClosed on close."""
        message = b""
        while True:
            first, second = self._recv_exactly(2)
            fin, opcode = first & 0x80, first & 0x0F
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._recv_exactly(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._recv_exactly(8))[0]
            mask = self._recv_exactly(4) if second & 0x80 else b""
            payload = self._recv_exactly(length)
            if mask:
                payload = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
            if opcode == OP_PING:
                self._send_frame(OP_PONG, payload)
                continue
            if opcode == OP_PONG:
                continue
            if opcode == OP_CLOSE:
                self.close()
                raise ConnectionClosed("peer sent close")
            message += payload
            if fin:
                return message
