// Declarations that TensorFlow's tsl/platform/fingerprint.h needs from farmhash.h, which the
// TensorFlow wheel does not ship. Only the XLA glue (xla_lowering.cc, xla_handlers.cc) sees this
// directory; it calls none of these.
#ifndef TF_RNNT_XLA_COMPAT_FARMHASH_H_
#define TF_RNNT_XLA_COMPAT_FARMHASH_H_

#include <cstddef>
#include <cstdint>
#include <utility>

namespace util {
using uint128_t = std::pair<uint64_t, uint64_t>;
inline uint64_t Uint128Low64(const uint128_t& x) { return x.first; }
inline uint64_t Uint128High64(const uint128_t& x) { return x.second; }
uint32_t Fingerprint32(const char* s, size_t len);
uint64_t Fingerprint64(const char* s, size_t len);
uint128_t Fingerprint128(const char* s, size_t len);
}  // namespace util

#endif  // TF_RNNT_XLA_COMPAT_FARMHASH_H_
