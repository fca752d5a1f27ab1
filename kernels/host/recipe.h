// Launch sequences recorded from the Python path (jitops/native.py, `Recording`), replayed from C++ on a call's
// own tensors.  An op whose launches depend on more than a few numbers (jitops.layer_norm's backward picks among
// four kernel sequences by rows and width, its grids from each kernel's occupancy) is not re-derived here: its
// Python path records what it launched for one exact problem, and every later call of that problem replays it.
#pragma once

#include "common.h"

namespace jitops_host {

constexpr size_t kMaxArgumentBytes = 512;  // a recorded launch's packed arguments (layer_norm's: 72 bytes)
constexpr size_t kMaxArguments = 32;
constexpr int kMaxSlots = 16;              // a call's tensors, then its workspaces
using Slots = std::array<const void*, kMaxSlots>;

// One kernel launch: its arguments packed as the Python launcher packs them (jitops/launch.py), every pointer
// field left zero, and which slot fills each one (a null pointer has no entry).
struct RecordedLaunch {
  void* function;
  unsigned grid[3];
  unsigned block[3];
  unsigned smem;
  std::vector<uint8_t> arguments;
  std::vector<uint32_t> offsets;                     // each argument's offset in `arguments`
  std::vector<std::pair<uint32_t, int>> pointers;    // (offset, slot)
};

struct Recipe {
  std::vector<RecordedLaunch> launches;
  std::vector<std::pair<int, int64_t>> workspaces;   // (slot, bytes): scratch that the launches share
};

// As Python hands a recording over: (function, grid, block, shared memory, packed arguments, argument offsets,
// [(offset, slot)]) per launch, and [(slot, bytes)] of the workspaces.
using OfferedLaunch = std::tuple<int64_t, std::array<int64_t, 3>, std::array<int64_t, 3>, int64_t, std::string,
                                 std::vector<int64_t>, std::vector<std::pair<int64_t, int64_t>>>;

std::unique_ptr<Recipe> make_recipe(const std::vector<OfferedLaunch>& offered,
                                    const std::vector<std::pair<int64_t, int64_t>>& workspaces, int call_slots) {
  auto recipe = std::make_unique<Recipe>();
  for (const auto& [function, grid, block, smem, arguments, offsets, pointers] : offered) {
    TORCH_CHECK(arguments.size() <= kMaxArgumentBytes && offsets.size() <= kMaxArguments,
                "jitops native offer: a launch of ", offsets.size(), " arguments in ", arguments.size(),
                " bytes, more than the host path takes");
    RecordedLaunch launch;
    launch.function = reinterpret_cast<void*>(function);
    for (int i = 0; i < 3; ++i) {
      launch.grid[i] = static_cast<unsigned>(grid[i]);
      launch.block[i] = static_cast<unsigned>(block[i]);
    }
    launch.smem = static_cast<unsigned>(smem);
    launch.arguments.assign(arguments.begin(), arguments.end());
    for (int64_t offset : offsets) {
      TORCH_CHECK(offset >= 0 && static_cast<size_t>(offset) < arguments.size(), "jitops native offer: bad offset");
      launch.offsets.push_back(static_cast<uint32_t>(offset));
    }
    for (const auto& [offset, slot] : pointers) {
      TORCH_CHECK(offset >= 0 && static_cast<size_t>(offset) + 8 <= arguments.size() && slot >= 0 &&
                      slot < kMaxSlots,
                  "jitops native offer: a pointer field out of range");
      launch.pointers.emplace_back(static_cast<uint32_t>(offset), static_cast<int>(slot));
    }
    recipe->launches.push_back(std::move(launch));
  }
  for (const auto& [slot, bytes] : workspaces) {
    TORCH_CHECK(slot >= call_slots && slot < kMaxSlots && bytes >= 0, "jitops native offer: bad workspace slot");
    recipe->workspaces.emplace_back(static_cast<int>(slot), bytes);
  }
  return recipe;
}

// The recorded launches on the call's tensors (slots[0..] as the op's section lays them out), on the device's
// current stream.  Workspaces come from torch's caching allocator and go back to it when the launches are queued,
// as the Python path's do (stream-ordered reuse).
void replay(const Recipe& recipe, int device, Slots slots, const at::TensorOptions& options) {
  std::array<at::Tensor, kMaxSlots> workspaces;
  for (const auto& [slot, bytes] : recipe.workspaces) {
    workspaces[slot] = at::empty({bytes}, options.dtype(at::kByte));
    slots[slot] = workspaces[slot].data_ptr();
  }
  for (const RecordedLaunch& launch : recipe.launches) {
    alignas(16) uint8_t arguments[kMaxArgumentBytes];
    std::memcpy(arguments, launch.arguments.data(), launch.arguments.size());
    for (const auto& [offset, slot] : launch.pointers) std::memcpy(arguments + offset, &slots[slot], 8);
    void* fields[kMaxArguments];
    for (size_t i = 0; i < launch.offsets.size(); ++i) fields[i] = arguments + launch.offsets[i];
    launch_kernel(launch.function, launch.grid, launch.block, launch.smem, device, fields);
  }
}

}  // namespace jitops_host
