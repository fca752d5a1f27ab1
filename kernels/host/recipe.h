// Launch sequences recorded from the Python path (jitops/native.py, `Recording`), replayed from C++ on a call's
// own tensors.  An op whose launches depend on more than a few numbers (jitops.layer_norm's backward picks among
// four kernel sequences by rows and width, its grids from each kernel's occupancy) is not re-derived here: its
// Python path records what it launched for one exact problem, and every later call of that problem replays it.
#pragma once

#include "common.h"

namespace jitops_host {

constexpr size_t kMaxArgumentBytes = 1280;  // a launch's packed arguments (a strided dgrad's light Params)
constexpr size_t kMaxArguments = 32;
constexpr int kMaxSlots = 16;              // a call's tensors, then its workspaces
constexpr int kStreamSlot = -2;            // a host call's stream argument: the current stream (native.STREAM_SLOT)
using Slots = std::array<const void*, kMaxSlots>;

// Host-library calls: the one C signature the host path calls, the CUTLASS conv library's jitops_conv2d
// (kernels/conv/conv2d_sm90.cu: a, b, d, bias, 15 int32 problem values, 3 int64 strides, splits, device, SM
// count, stream) -> status.  A recording names each argument's kind (native._HOST_KINDS); an offer of another
// signature is refused.
enum HostKind : int64_t { kPointer = 0, kInt32 = 1, kInt64 = 2 };
using ConvEntry = int (*)(const void*, const void*, void*, const void*, int32_t, int32_t, int32_t, int32_t, int32_t,
                          int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t,
                          int64_t, int64_t, int64_t, int32_t, int32_t, int32_t, void*);

const std::vector<int64_t>& conv_entry_kinds() {
  static const std::vector<int64_t> kinds = [] {
    std::vector<int64_t> k(4, kPointer);
    k.insert(k.end(), 15, kInt32);
    k.insert(k.end(), 3, kInt64);
    k.insert(k.end(), 3, kInt32);
    k.push_back(kPointer);
    return k;
  }();
  return kinds;
}

// One kernel launch: its arguments packed as the Python launcher packs them (jitops/launch.py), every pointer
// field left zero, and which slot fills each one (a null pointer has no entry).
struct RecordedLaunch {
  bool host_call;  // a call of a ConvEntry (arguments: one int64 each) instead of a kernel launch
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

// An op's recorded problems: the table of the current config generation (under table_guard) and every recipe
// ever offered, never freed (a backward node may hold one past a config change).
template <typename Key>
struct RecipeTable {
  Table<Key, const Recipe*> current;
  std::vector<std::unique_ptr<Recipe>> kept;

  const Recipe* find(const Key& key) const { return find_offered(current, key); }

  void add(const Key& key, std::unique_ptr<Recipe> recipe) {  // caller holds table_guard
    current[key] = recipe.get();
    kept.push_back(std::move(recipe));
  }
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
    launch.host_call = grid[0] == 0;
    if (launch.host_call) {  // `offsets` holds the arguments' kinds
      TORCH_CHECK(offsets == conv_entry_kinds() && arguments.size() == 8 * offsets.size(),
                  "jitops native offer: a host call whose signature is not jitops_conv2d's");
    }
    launch.function = reinterpret_cast<void*>(function);
    for (int i = 0; i < 3; ++i) {
      launch.grid[i] = static_cast<unsigned>(grid[i]);
      launch.block[i] = static_cast<unsigned>(block[i]);
    }
    launch.smem = static_cast<unsigned>(smem);
    launch.arguments.assign(arguments.begin(), arguments.end());
    for (int64_t offset : offsets) {
      TORCH_CHECK(launch.host_call || (offset >= 0 && static_cast<size_t>(offset) < arguments.size()),
                  "jitops native offer: bad offset");
      launch.offsets.push_back(static_cast<uint32_t>(offset));
    }
    for (const auto& [offset, slot] : pointers) {
      TORCH_CHECK(offset >= 0 && static_cast<size_t>(offset) + 8 <= arguments.size() &&
                      ((slot >= 0 && slot < kMaxSlots) || (launch.host_call && slot == kStreamSlot)),
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

// A recorded jitops_conv2d call on the call's tensors and the current stream; its status checked.
void call_host(const RecordedLaunch& launch, int device, uint8_t* arguments, const Slots& slots) {
  int64_t v[26];
  std::memcpy(v, arguments, sizeof(v));
  for (const auto& [offset, slot] : launch.pointers) {
    const void* address = slot == kStreamSlot ? current_stream(device) : slots[slot];
    std::memcpy(&v[offset / 8], &address, 8);
  }
  auto p = [&](int i) { return reinterpret_cast<void*>(v[i]); };
  auto i32 = [&](int i) { return static_cast<int32_t>(v[i]); };
  const int status = reinterpret_cast<ConvEntry>(launch.function)(
      p(0), p(1), p(2), p(3), i32(4), i32(5), i32(6), i32(7), i32(8), i32(9), i32(10), i32(11), i32(12), i32(13),
      i32(14), i32(15), i32(16), i32(17), i32(18), v[19], v[20], v[21], i32(22), i32(23), i32(24), p(25));
  TORCH_CHECK(status == 0, "jitops.conv2d (C++ host path): the CUTLASS conv library returned status ", status,
              " (jitops/ops/conv2d_run.py's _STATUS names it)");
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
    if (launch.host_call) {
      call_host(launch, device, arguments, slots);
      continue;
    }
    for (const auto& [offset, slot] : launch.pointers) std::memcpy(arguments + offset, &slots[slot], 8);
    void* fields[kMaxArguments];
    for (size_t i = 0; i < launch.offsets.size(); ++i) fields[i] = arguments + launch.offsets[i];
    launch_kernel(launch.function, launch.grid, launch.block, launch.smem, device, fields);
  }
}

}  // namespace jitops_host
