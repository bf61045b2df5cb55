// A restricted unpickler for the data.pkl that torch.save writes: it knows only the opcodes Python's pickler
// emits for plain data (protocols 2-4) and only the Python objects a state dict refers to (OrderedDict, tensor
// rebuilding, storage classes). Anything else — a GLOBAL of os.system, an unknown class, an opcode that builds
// arbitrary objects — is refused with one line at the opcode that asks for it. Nothing is ever "called": tensors
// come back as descriptions of views into the archive's storages, read later.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sd::io {

// A storage record: the archive entry data/<key>, `numel` elements of `dtype`.
struct TorchStorage {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  int64_t numel = 0;
};

// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): a strided view into a storage, checked to
// lie inside it.
struct TorchTensorView {
  TorchStorage storage;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;

  // Elements of the storage the view spans from `offset` (0 for an empty tensor); nullopt if that overflows.
  std::optional<int64_t> span() const;
};

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kStorage,
    kTensor,
    kInert
  };
  Kind kind = Kind::kNone;
  int64_t integer = 0;                                   // kBool, kInt
  double real = 0;                                       // kFloat
  std::string text;                                      // kString, kBytes, kGlobal/kInert: "module.name"
  std::vector<PickleRef> items;                          // kTuple, kList
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // kDict, in insertion order
  TorchStorage storage;                                  // kStorage
  TorchTensorView tensor;                                // kTensor
};

// Size in bytes of the archive's data/<key> entry; throws sd::Error if there is none.
using StorageBytes = std::function<uint64_t(const std::string& key)>;

// Unpickles `bytes` (`what` names them in errors, e.g. "model.bin"). Persistent ids must be torch's storage records
// ('storage', torch.<Type>Storage, key, location, numel) whose entries hold exactly numel elements.
PickleRef unpickle_torch(std::string_view bytes, const std::string& what, const StorageBytes& storage_bytes);

}  // namespace sd::io
