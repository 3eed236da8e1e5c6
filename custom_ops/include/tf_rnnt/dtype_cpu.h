// Host loaders for the three float formats, chosen at run time by dispatch_dtype.
#ifndef TF_RNNT_DTYPE_CPU_H_
#define TF_RNNT_DTYPE_CPU_H_

#include <cstdint>

#include "tf_rnnt/node_math.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

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
