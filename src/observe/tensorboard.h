// TensorBoard event files, written without TensorFlow: TFRecord framing (length, masked CRC-32C of
// the length, the record, masked CRC-32C of the record) of tensorflow.Event protocol buffers
// encoded by hand (wall_time, step, file_version or a Summary of scalar Values: tag and
// simple_value), what tensorboard's EventFileWriter and torch's SummaryWriter write for scalars.
// tests/test_observe.cpp compares the bytes with a file tensorboard's own writer made
// (tools/make_tensorboard_fixtures.py), and tools/check_tensorboard.py reads a run's events back
// with tensorboard's EventAccumulator.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace st::observe {

// CRC-32C (Castagnoli), and the masked form TFRecord stores.
uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);

// One TFRecord: the framed bytes of `data`.
std::string FrameRecord(std::string_view data);

struct Scalar {
  std::string tag;
  float value = 0;
};

// The serialized Event of a file's first record ("brain.Event:2") and of scalars at a step.
std::string FileVersionEvent(double wall_time);
// A SessionLog START at `step`: TensorBoard's readers (EventAccumulator and the data server's
// plugin accumulator) then drop every event seen so far whose step is >= step, what torch's
// SummaryWriter(purge_step=step) writes so that a run restarted from a checkpoint does not show
// the crashed run's later steps beside the redone ones.
std::string SessionStartEvent(double wall_time, int64_t step);
std::string ScalarsEvent(double wall_time, int64_t step, const std::vector<Scalar>& scalars);

class EventFileWriter {
 public:
  // Creates dir and events.out.tfevents.<unix seconds>.<host> in it, and writes the version
  // record, then with purge_step > 0 a SessionStartEvent at it (a resumed run).
  static StatusOr<EventFileWriter> Open(const std::string& dir, double wall_time,
                                        int64_t purge_step = 0);
  EventFileWriter(EventFileWriter&& other) noexcept;
  EventFileWriter& operator=(EventFileWriter&& other) noexcept;
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  ~EventFileWriter();

  // Appends one event and flushes it (TensorBoard reads the file while it grows).
  Status Add(double wall_time, int64_t step, const std::vector<Scalar>& scalars);
  const std::string& path() const { return path_; }

 private:
  EventFileWriter() = default;
  Status Write(const std::string& event);
  std::FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace st::observe
