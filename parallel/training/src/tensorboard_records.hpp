#pragma once
// TensorBoard's event file format, the few parts a scalar writer needs (docs/tensorboard.md):
//  - a record is  uint64 length | uint32 masked CRC-32C of the length | data | uint32 masked
//    CRC-32C of the data, little-endian (TensorFlow's TFRecord framing);
//  - the data is a protobuf `tensorboard.Event`: wall_time = 1 (double), step = 2 (int64),
//    file_version = 3 (string), summary = 5 (Summary: repeated Value value = 1; Value: tag =
//    1, simple_value = 2 (float)), session_log = 7 (SessionLog: status = 1, START = 1).
// Written by hand: Debian ships neither TensorBoard's .proto files nor a TFRecord writer,
// and these three messages are a few varints; tests read the result back with TensorBoard's
// own EventAccumulator.
#include <cstdint>
#include <string>
#include <string_view>

namespace phalanx::parallel::tensorboard {

/// CRC-32C (Castagnoli), as TFRecord uses it.
std::uint32_t crc32c(const void* data, std::size_t n);
/// TFRecord's masked CRC: rotate right by 15, add 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// Appends one framed record holding `payload` to `out`.
void append_record(std::string& out, std::string_view payload);

/// The serialised Events. Each clears `out` first (a reusable buffer).
void encode_file_version_event(std::string& out, double wall_time);
void encode_scalar_event(std::string& out, double wall_time, std::int64_t step, std::string_view tag,
                         float value);
/// SessionLog START at `step`: TensorBoard drops what earlier runs logged at this step and
/// after (a run resumed from a checkpoint does not show the lost steps twice).
void encode_session_start_event(std::string& out, double wall_time, std::int64_t step);

}  // namespace phalanx::parallel::tensorboard
