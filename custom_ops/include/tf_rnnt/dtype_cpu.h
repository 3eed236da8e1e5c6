// Host conversions and loaders for the three float formats, chosen at run time by
// dispatch_dtype.
#ifndef TF_RNNT_DTYPE_CPU_H_
#define TF_RNNT_DTYPE_CPU_H_

#include <cstdint>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

// A float's bits, and the float of given bits.
inline uint32_t float_bits(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  return x;
}
inline float bits_to_float(uint32_t bits) {
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even conversions of the 16-bit float formats (dtype_cuda.cuh has the device
// side, through cuda_fp16.h / cuda_bf16.h).
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  return bits_to_float(bits);
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  const uint16_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                        // subnormal or zero in half
    if (abs < 0x33000000u) return sign;           // < 2^-25 rounds to 0
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 + (113 - e) - 1 + ...
    uint32_t half_m = m >> (shift);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return sign | static_cast<uint16_t>(half_m);
  }
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  return bits_to_float(bits);
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

struct LoadFloat32 {
  using Storage = float;
  static float to_float(float x) { return x; }
  static float from_float(float x) { return x; }
};

struct LoadFloat16 {
  using Storage = uint16_t;
  static float to_float(uint16_t x) { return half_bits_to_float(x); }
  static uint16_t from_float(float x) { return float_to_half_bits(x); }
};

struct LoadBFloat16 {
  using Storage = uint16_t;
  static float to_float(uint16_t x) { return bf16_bits_to_float(x); }
  static uint16_t from_float(float x) { return float_to_bf16_bits(x); }
};

template <typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(LoadFloat32());
      break;
    case DType::kFloat16:
      fn(LoadFloat16());
      break;
    case DType::kBFloat16:
      fn(LoadBFloat16());
      break;
  }
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_DTYPE_CPU_H_
