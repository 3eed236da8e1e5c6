// The message of a failed TfRnntCheck: the op's message, then the entries of its int32 `data`.
#ifndef TF_RNNT_TF_CHECK_MESSAGE_H_
#define TF_RNNT_TF_CHECK_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tf_rnnt {

inline std::string check_message(const std::string& message, const int32_t* data, size_t count) {
  if (count == 0) return message;
  std::string out = message + " [";
  for (size_t i = 0; i < count; ++i) out += (i ? ", " : "") + std::to_string(data[i]);
  return out + "]";
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_CHECK_MESSAGE_H_
