"""A KV event publisher in SGLang's wire format, with the libraries SGLang
uses (pyzmq, msgspec): PUB frames [topic, seq (8 bytes, big-endian),
msgpack batch], a ROUTER that replays buffered batches to a DEALER that
sends ["", start seq], ending with ["", "", -1, ""].

Usage: publisher.py PUB_PORT REPLAY_PORT [SHAPE]. SHAPE is the replay
answer's: "sglang" (the default, SGLang 0.5.23's ["", topic, seq,
payload], ending with ["", "", -1, ""]) or "vllm" (vLLM's and older
SGLang's ["", seq, payload], ending with ["", -1, ""]). Prints "ready", then reads
lines on stdin: "probe" publishes a batch (hash -1); "go" publishes six
batches (hashes 100 to 105), the third and fourth kept out of the PUB
socket but in the replay buffer, prints the number of sequence numbers
used, and serves replays until stdin closes.
"""
import sys
import threading
import msgspec
import zmq

from sglang_events import Batch, BlockStored  # noqa: E402

ctx = zmq.Context.instance()
pub = ctx.socket(zmq.PUB)
pub.bind(f"tcp://127.0.0.1:{sys.argv[1]}")
router = ctx.socket(zmq.ROUTER)
router.bind(f"tcp://127.0.0.1:{sys.argv[2]}")
shape = sys.argv[3] if len(sys.argv) > 3 else "sglang"
# The frames between the DEALER's identity and the sequence.
head = (b"", b"") if shape == "sglang" else (b"",)
enc = msgspec.msgpack.Encoder()
buffer = []
lock = threading.Lock()
seq = 0


def publish(h, send=True):
    global seq
    payload = enc.encode(Batch(1.0, [BlockStored([h], None, [1, 2], 2, None)], 0))
    with lock:
        buffer.append((seq, payload))
        frames = (b"", seq.to_bytes(8, "big"), payload)
        seq += 1
    if send:
        pub.send_multipart(frames)


def serve_replay():
    while True:
        try:
            client, _, start = router.recv_multipart()
        except zmq.ZMQError:
            return
        start = int.from_bytes(start, "big")
        with lock:
            for s, payload in buffer:
                if s >= start:
                    router.send_multipart((client, *head, s.to_bytes(8, "big"), payload))
        router.send_multipart((client, *head, (-1).to_bytes(8, "big", signed=True), b""))


threading.Thread(target=serve_replay, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "probe":
        publish(-1)
    elif cmd == "go":
        for i in range(6):
            publish(100 + i, send=i not in (2, 3))
        print(seq, flush=True)
