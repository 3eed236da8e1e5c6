// What the ops' shape functions (ops.cc, tdt_ops.cc) share.
#ifndef TF_RNNT_TF_SHAPE_FNS_H_
#define TF_RNNT_TF_SHAPE_FNS_H_

#include <initializer_list>

#include "tensorflow/core/framework/shape_inference.h"

namespace tf_rnnt {

// [B, T, U1, ...] input at `index` with `rank` (into *shape when not null); merges B with the [B]
// vectors at `vectors`.
inline ::tensorflow::Status batch_dim(::tensorflow::shape_inference::InferenceContext* c, int index,
                                      int rank, std::initializer_list<int> vectors,
                                      ::tensorflow::shape_inference::DimensionHandle* batch,
                                      ::tensorflow::shape_inference::ShapeHandle* shape = nullptr) {
  ::tensorflow::shape_inference::ShapeHandle s;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), rank, &s));
  *batch = c->Dim(s, 0);
  for (int v : vectors) {
    ::tensorflow::shape_inference::ShapeHandle vec;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(v), 1, &vec));
    TF_RETURN_IF_ERROR(c->Merge(*batch, c->Dim(vec, 0), batch));
  }
  if (shape != nullptr) *shape = s;
  return ::tensorflow::Status();
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_SHAPE_FNS_H_
