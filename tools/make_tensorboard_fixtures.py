#!/usr/bin/env python3
"""Writes tests/fixtures/tensorboard/: a TensorBoard event file made by tensorboard's own record writer and
protocol buffers, and the events it holds as JSON, for slicetrain's hand-written writer
(src/observe/tensorboard.h) to reproduce byte for byte.

  events.bin   TFRecords (tensorboard.summary.writer.record_writer.RecordWriter) of tensorflow.Event protos
               (tensorboard.compat.proto.event_pb2): the file-version event, then scalar events whose
               Summary.Value has tag and simple_value, as torch's SummaryWriter.add_scalar writes them, and a
               SessionLog START (what SummaryWriter(purge_step=N) writes when a run restarts at step N)
  events.json  {"version_wall_time": t, "events": [{"wall_time", "step", "scalars": [[tag, value], ...]}
               or {"wall_time", "step", "session_log": "START"}]}

The wall times are fixed (no clock), so the bytes are the same on every run:
  tools/.venv/bin/python tools/make_tensorboard_fixtures.py
"""
import io
import json
import os

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "tests", "fixtures", "tensorboard"))

EVENTS = [
    {"wall_time": 1796400000.25, "step": 1, "scalars": [["train/loss", 2.5], ["train/learning_rate", 0.001]]},
    {"wall_time": 1796400000.75, "step": 0, "scalars": [["train/loss", 9.0]]},  # step 0 is not written
    {"wall_time": 1796400001.0, "step": 1 << 40, "scalars": [["big/step", -3.75e-7]]},
    {"wall_time": 1796400002.5, "step": 300, "scalars": [["epoch/loss", 1.0e30], ["ünïcode/tag", 0.0]]},
    {"wall_time": 1796400003.0, "step": 301, "scalars": []},
    {"wall_time": 1796400004.5, "step": 201, "session_log": "START"},
    {"wall_time": 1796400005.0, "step": 201, "scalars": [["train/loss", 1.5]]},
]


def main():
    buf = io.BytesIO()
    writer = RecordWriter(buf)
    version_wall_time = 1796399999.5
    writer.write(event_pb2.Event(wall_time=version_wall_time, file_version="brain.Event:2").SerializeToString())
    for e in EVENTS:
        if "session_log" in e:
            log = event_pb2.SessionLog(status=event_pb2.SessionLog.SessionStatus.Value(e["session_log"]))
            writer.write(event_pb2.Event(wall_time=e["wall_time"], step=e["step"], session_log=log).SerializeToString())
            continue
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in e["scalars"]]
        ev = event_pb2.Event(wall_time=e["wall_time"], step=e["step"], summary=summary_pb2.Summary(value=values))
        writer.write(ev.SerializeToString())
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "events.bin"), "wb") as f:
        f.write(buf.getvalue())
    with open(os.path.join(OUT, "events.json"), "w", encoding="utf-8") as f:
        json.dump({"version_wall_time": version_wall_time, "events": EVENTS}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(EVENTS) + 1} events, {len(buf.getvalue())} bytes")


if __name__ == "__main__":
    main()
