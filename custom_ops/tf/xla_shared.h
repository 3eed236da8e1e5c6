// What the XLA FFI handlers (xla_handlers.cc, tdt_xla.cc, check_xla.cc) share: the thread-pool
// ParallelFor of the Host handlers and the registration of a handler with XLA.
#ifndef TF_RNNT_TF_XLA_SHARED_H_
#define TF_RNNT_TF_XLA_SHARED_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>

#include "tf_rnnt/rnnt_core.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#if TF_RNNT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

// XLA's FFI API (the XLA library in the TensorFlow the op library is loaded into).
extern "C" const XLA_FFI_Api* XLA_FFI_GetApi();

namespace tf_rnnt {

// ParallelFor on XLA's intra-op thread pool. The caller takes shards too and never waits for a
// task that has not started, so it cannot deadlock when the pool is busy.
inline ParallelFor pool_parallel_for(::xla::ffi::ThreadPool* pool) {
  return [pool](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    const int64_t threads = std::max<int64_t>(1, pool->num_threads());
    // Shards of at least ~100k cycles; a few per thread for balance.
    const int64_t min_shard = std::max<int64_t>(1, 100000 / std::max<int64_t>(cost, 1));
    const int64_t shard = std::max(min_shard, (total + 4 * threads - 1) / (4 * threads));
    const int64_t shards = (total + shard - 1) / shard;
    if (shards == 1 || threads == 1) {
      fn(0, total);
      return;
    }
    struct State {
      std::atomic<int64_t> next{0};
      std::atomic<int64_t> done{0};
      std::mutex mu;
      std::condition_variable cv;
    };
    auto state = std::make_shared<State>();
    auto work = [state, &fn, total, shard, shards]() {
      for (;;) {
        const int64_t i = state->next.fetch_add(1);
        if (i >= shards) return;
        fn(i * shard, std::min(total, (i + 1) * shard));
        if (state->done.fetch_add(1) + 1 == shards) {
          std::lock_guard<std::mutex> lock(state->mu);
          state->cv.notify_all();
        }
      }
    };
    // Tasks that start after every shard is taken return at once (they hold `state` alive and
    // never touch `fn`).
    for (int64_t i = 1; i < std::min(threads, shards); ++i) {
      pool->Schedule([state, shards, work]() {
        if (state->next.load() < shards) work();
      });
    }
    work();
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->done.load() == shards; });
  };
}

// Registers the custom call `name`'s handler for `platform` ("Host" or "CUDA"); a failure is
// reported on stderr (the op then fails when XLA compiles a call to it).
inline void register_handler(const XLA_FFI_Api* api, const char* name, const char* platform,
                             XLA_FFI_Handler* handler) {
  XLA_FFI_Handler_Register_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
  args.name = XLA_FFI_ByteSpan{name, std::strlen(name)};
  args.platform = XLA_FFI_ByteSpan{platform, std::strlen(platform)};
  args.bundle.execute = handler;
  if (XLA_FFI_Error* error = api->XLA_FFI_Handler_Register(&args)) {
    XLA_FFI_Error_GetMessage_Args message;
    std::memset(&message, 0, sizeof(message));
    message.struct_size = XLA_FFI_Error_GetMessage_Args_STRUCT_SIZE;
    message.error = error;
    api->XLA_FFI_Error_GetMessage(&message);
    std::fprintf(stderr, "tf_rnnt: could not register XLA custom call %s for %s: %s\n", name,
                 platform, message.message);
    XLA_FFI_Error_Destroy_Args destroy;
    std::memset(&destroy, 0, sizeof(destroy));
    destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
    destroy.error = error;
    api->XLA_FFI_Error_Destroy(&destroy);
  }
}

}  // namespace tf_rnnt

#endif  // TF_RNNT_TF_XLA_SHARED_H_
