#include "tensorboard_records.hpp"

#include <array>
#include <cstring>

namespace phalanx::parallel::tensorboard {

namespace {

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    table[i] = c;
  }
  return table;
}
constexpr auto kCrcTable = make_crc_table();

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint, 1 fixed64, 2 bytes, 5 fixed32.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}
template <typename T>
void put_fixed(std::string& out, T value) {  // little-endian hosts only (x86-64, aarch64)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}
std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void put_event_head(std::string& out, double wall_time) {
  out.clear();
  put_key(out, 1, 1);
  put_fixed(out, wall_time);
}
void put_step(std::string& out, std::int64_t step) {
  put_key(out, 2, 0);
  put_varint(out, static_cast<std::uint64_t>(step));  // int64: negatives as ten-byte two's complement
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void append_record(std::string& out, std::string_view payload) {
  const std::uint64_t length = payload.size();
  char head[sizeof(length)];
  std::memcpy(head, &length, sizeof(length));
  out.append(head, sizeof(head));
  put_fixed(out, masked_crc32c(head, sizeof(head)));
  out.append(payload.data(), payload.size());
  put_fixed(out, masked_crc32c(payload.data(), payload.size()));
}

void encode_file_version_event(std::string& out, double wall_time) {
  put_event_head(out, wall_time);
  put_bytes(out, 3, "brain.Event:2");
}

void encode_scalar_event(std::string& out, double wall_time, std::int64_t step, std::string_view tag,
                         float value) {
  put_event_head(out, wall_time);
  put_step(out, step);
  // Value { tag = 1; simple_value = 2 }, inside Summary { value = 1 }, inside Event.summary = 5
  const std::size_t value_size = 1 + varint_size(tag.size()) + tag.size() + 1 + sizeof(float);
  const std::size_t summary_size = 1 + varint_size(value_size) + value_size;
  put_key(out, 5, 2);
  put_varint(out, summary_size);
  put_key(out, 1, 2);
  put_varint(out, value_size);
  put_bytes(out, 1, tag);
  put_key(out, 2, 5);
  put_fixed(out, value);
}

void encode_session_start_event(std::string& out, double wall_time, std::int64_t step) {
  put_event_head(out, wall_time);
  put_step(out, step);
  put_key(out, 7, 2);  // session_log = 7: SessionLog { status = 1: START = 1 }
  put_varint(out, 2);
  put_key(out, 1, 0);
  put_varint(out, 1);
}

}  // namespace phalanx::parallel::tensorboard
