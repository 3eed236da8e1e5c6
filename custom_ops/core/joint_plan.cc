// The plan of a joint pass (rnnt_core.h: plan_joint_pass): its tile and workspace.
#include <algorithm>

#include "tf_rnnt/rnnt_core.h"

namespace tf_rnnt {

size_t joint_workspace_bytes(const JointShape& shape, const JointOptions& options,
                             int64_t tile_nodes, bool backward, bool untiled, bool gpu) {
  return gpu ? joint_workspace_bytes_cuda(shape, options, tile_nodes, backward, untiled)
             : joint_workspace_bytes_cpu(shape, options, tile_nodes, backward, untiled);
}

Status plan_joint_pass(const JointShape& s, const JointOptions& options, int64_t num_nodes,
                       const JointTileRequest& request, bool backward, bool gpu,
                       JointPassPlan* plan) {
  const int64_t nodes_max = static_cast<int64_t>(s.B) * s.T * s.U1;
  if (s.B < 0 || s.T < 0 || s.H < 0 || s.U1 < 1 || s.D < 0 || s.V - s.D < 1 || num_nodes < 0 ||
      num_nodes > nodes_max || request.tile_nodes < 0 || request.memory_budget < 0) {
    Status st;
    st.code = StatusCode::kInvalidArgument;
    st.message =
        "the joint's sizes cannot be planned (negative, U+1 or V - D below 1, or more "
        "valid nodes than B T (U+1))";
    return st;
  }
  int64_t tile = 1;
  if (request.untiled) {
    tile = std::max<int64_t>(num_nodes, 1);
  } else if (num_nodes > 0 && request.tile_nodes > 0) {
    tile = std::min(request.tile_nodes, num_nodes);
  } else if (num_nodes > 0) {
    const int64_t budget = request.memory_budget > 0 ? request.memory_budget
                           : gpu                     ? kDefaultGpuTileBudget
                                                     : kDefaultCpuTileBudget;
    // Marginal bytes per node (the workspace also holds tile-independent buffers).
    const auto bytes = [&](int64_t nodes) {
      return static_cast<int64_t>(joint_workspace_bytes(s, options, nodes, true, false, gpu));
    };
    const int64_t per_node = (bytes(2048) - bytes(1024)) / 1024;
    tile = std::max<int64_t>(1, std::min(num_nodes, budget / std::max<int64_t>(per_node, 1)));
  }
  plan->tile_nodes = tile;
  plan->workspace_bytes = joint_workspace_bytes(s, options, tile, backward, request.untiled, gpu);
  return Status();
}

}  // namespace tf_rnnt
