#pragma once
// The job token of a torchrun-style launch: derived from the job's identity (phalanx-run's
// --rdzv-id; Slurm's job and step ids for workers started by srun) and an optional secret
// (PHALANX_RDZV_SECRET), so every node of one job computes the same token and nodes of
// different jobs refuse each other. SHA-256 (FIPS 180-4) and HMAC (RFC 2104) are implemented
// here: no crypto library is needed for this. A single node given no token (nor an id with a
// secret) gets a random one.
#include <array>
#include <cstdint>
#include <string>

namespace phalanx::parallel {

using Sha256Digest = std::array<std::uint8_t, 32>;

Sha256Digest sha256(const std::string& data);
Sha256Digest hmac_sha256(const std::string& key, const std::string& message);
std::string to_hex(const Sha256Digest& d);

/// The token for job `id`: hex(HMAC-SHA256(key = secret, message = "phalanx-rdzv-v1:" + id)).
/// With an empty secret anyone who knows the id can compute it: the id names the job, it
/// does not protect it.
std::string derive_rdzv_token(const std::string& id, const std::string& secret);

/// A single node's job token when none is given: 16 random bytes as hex. False (with
/// `error` set) when the system cannot give them: an all-zero token would let any process
/// on the host join the job.
bool random_token(std::string& token, std::string& error);

/// The environment variable the secret is read from.
constexpr const char* kRdzvSecretEnv = "PHALANX_RDZV_SECRET";

}  // namespace phalanx::parallel
