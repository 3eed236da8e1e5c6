// upload_cuda (rnnt_core.h): host-to-device copies of the ops' labels and lengths. TensorFlow's
// own copy of a host tensor to the GPU completes through its event poller, a few hundred
// microseconds after the copy itself, and the op waits for it before it can launch anything.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "tf_rnnt/cuda_status.h"
#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {
namespace {

// One pinned buffer and the event recorded after the last copy from it.
struct StagingBuffer {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t copied = nullptr;
};

// A device's staging buffers, used in turn. Reusing one waits for its last copy, which only a
// host more than kBuffers uploads ahead of the GPU finds unfinished.
struct Staging {
  static constexpr int kBuffers = 16;
  static constexpr size_t kMinBytes = 64 << 10;
  std::mutex mutex;
  StagingBuffer buffers[kBuffers];
  int next = 0;
};

Staging* staging_for(int device) {
  static std::mutex mutex;
  // Kept for the process, like the cuBLAS handles (cublas_loader.cc).
  static auto* staging = new std::unordered_map<int, Staging*>();
  std::lock_guard<std::mutex> lock(mutex);
  Staging*& s = (*staging)[device];
  if (s == nullptr) s = new Staging();
  return s;
}

}  // namespace

Status upload_cuda(void* device, const void* host, size_t bytes, GpuStream stream) {
  if (bytes == 0) return Status();
  int device_id = 0;
  Status s = cuda_status(cudaGetDevice(&device_id));
  if (!s.ok()) return s;
  Staging* staging = staging_for(device_id);
  std::lock_guard<std::mutex> lock(staging->mutex);
  StagingBuffer& buffer = staging->buffers[staging->next];
  staging->next = (staging->next + 1) % Staging::kBuffers;
  s = cuda_status(buffer.copied == nullptr
                      ? cudaEventCreateWithFlags(&buffer.copied, cudaEventDisableTiming)
                      : cudaEventSynchronize(buffer.copied));
  if (!s.ok()) return s;
  if (buffer.capacity < bytes) {
    if (buffer.host != nullptr) {
      s = cuda_status(cudaFreeHost(buffer.host));
      if (!s.ok()) return s;
      buffer.host = nullptr;
      buffer.capacity = 0;
    }
    const size_t capacity = std::max(bytes, Staging::kMinBytes);
    s = cuda_status(cudaHostAlloc(&buffer.host, capacity, cudaHostAllocDefault));
    if (!s.ok()) return s;
    buffer.capacity = capacity;
  }
  std::memcpy(buffer.host, host, bytes);
  const auto st = static_cast<cudaStream_t>(stream);
  s = cuda_status(cudaMemcpyAsync(device, buffer.host, bytes, cudaMemcpyHostToDevice, st));
  if (!s.ok()) return s;
  return cuda_status(cudaEventRecord(buffer.copied, st));
}

}  // namespace tf_rnnt
