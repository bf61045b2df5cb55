#include "io/torch_pickle.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "io/byte_reader.h"

namespace sd::io {

namespace {

using Kind = PickleValue::Kind;

// What a GLOBAL may name, and what sdtrain makes of it. Everything else is refused.
enum class Allowed {
  kOrderedDict,       // collections.OrderedDict(): the state dict itself, and empty backward-hook dicts
  kRebuildTensor,     // torch._utils._rebuild_tensor_v2: a tensor as a view into a storage
  kRebuildParameter,  // torch._utils._rebuild_parameter: an nn.Parameter around such a tensor
  kRestoreTypeTag,    // torch.jit._pickle.restore_type_tag(value, type): LibTorch's writer tags dicts with their type
  kStorageType,       // torch.FloatStorage, ...: names a storage's dtype inside a persistent id
  kInert,             // objects PyTorch Lightning checkpoints hold beside the weights; kept opaque, never built
};

struct AllowedGlobal {
  Allowed what;
  at::ScalarType dtype = at::kFloat;  // kStorageType only
};

const std::map<std::string, AllowedGlobal>& allowed_globals() {
  static const std::map<std::string, AllowedGlobal> table = {
      {"collections.OrderedDict", {Allowed::kOrderedDict}},
      {"torch._utils._rebuild_tensor_v2", {Allowed::kRebuildTensor}},
      {"torch._utils._rebuild_parameter", {Allowed::kRebuildParameter}},
      {"torch.jit._pickle.restore_type_tag", {Allowed::kRestoreTypeTag}},
      {"torch.DoubleStorage", {Allowed::kStorageType, at::kDouble}},
      {"torch.FloatStorage", {Allowed::kStorageType, at::kFloat}},
      {"torch.HalfStorage", {Allowed::kStorageType, at::kHalf}},
      {"torch.BFloat16Storage", {Allowed::kStorageType, at::kBFloat16}},
      {"torch.LongStorage", {Allowed::kStorageType, at::kLong}},
      {"torch.IntStorage", {Allowed::kStorageType, at::kInt}},
      {"torch.ShortStorage", {Allowed::kStorageType, at::kShort}},
      {"torch.CharStorage", {Allowed::kStorageType, at::kChar}},
      {"torch.ByteStorage", {Allowed::kStorageType, at::kByte}},
      {"torch.BoolStorage", {Allowed::kStorageType, at::kBool}},
      // Lightning's .ckpt files keep callback state (a ModelCheckpoint class as a dict key, numpy scalars) next to
      // the state dict; these are the objects A1111's safe unpickler lets through for the same reason.
      {"pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint", {Allowed::kInert}},
      {"numpy.core.multiarray.scalar", {Allowed::kInert}},
      {"numpy.dtype", {Allowed::kInert}},
      {"_codecs.encode", {Allowed::kInert}},
  };
  return table;
}

// Every opcode of pickle protocols 0-5, so a refused one is named.
const char* opcode_name(uint8_t op) {
  static const std::unordered_map<uint8_t, const char*> names = {{'(', "MARK"},
                                                                 {'.', "STOP"},
                                                                 {'0', "POP"},
                                                                 {'1', "POP_MARK"},
                                                                 {'2', "DUP"},
                                                                 {'F', "FLOAT"},
                                                                 {'I', "INT"},
                                                                 {'J', "BININT"},
                                                                 {'K', "BININT1"},
                                                                 {'L', "LONG"},
                                                                 {'M', "BININT2"},
                                                                 {'N', "NONE"},
                                                                 {'P', "PERSID"},
                                                                 {'Q', "BINPERSID"},
                                                                 {'R', "REDUCE"},
                                                                 {'S', "STRING"},
                                                                 {'T', "BINSTRING"},
                                                                 {'U', "SHORT_BINSTRING"},
                                                                 {'V', "UNICODE"},
                                                                 {'X', "BINUNICODE"},
                                                                 {'a', "APPEND"},
                                                                 {'b', "BUILD"},
                                                                 {'c', "GLOBAL"},
                                                                 {'d', "DICT"},
                                                                 {'}', "EMPTY_DICT"},
                                                                 {'e', "APPENDS"},
                                                                 {'g', "GET"},
                                                                 {'h', "BINGET"},
                                                                 {'i', "INST"},
                                                                 {'j', "LONG_BINGET"},
                                                                 {'l', "LIST"},
                                                                 {']', "EMPTY_LIST"},
                                                                 {'o', "OBJ"},
                                                                 {'p', "PUT"},
                                                                 {'q', "BINPUT"},
                                                                 {'r', "LONG_BINPUT"},
                                                                 {'s', "SETITEM"},
                                                                 {'t', "TUPLE"},
                                                                 {')', "EMPTY_TUPLE"},
                                                                 {'u', "SETITEMS"},
                                                                 {'G', "BINFLOAT"},
                                                                 {0x80, "PROTO"},
                                                                 {0x81, "NEWOBJ"},
                                                                 {0x82, "EXT1"},
                                                                 {0x83, "EXT2"},
                                                                 {0x84, "EXT4"},
                                                                 {0x85, "TUPLE1"},
                                                                 {0x86, "TUPLE2"},
                                                                 {0x87, "TUPLE3"},
                                                                 {0x88, "NEWTRUE"},
                                                                 {0x89, "NEWFALSE"},
                                                                 {0x8a, "LONG1"},
                                                                 {0x8b, "LONG4"},
                                                                 {'B', "BINBYTES"},
                                                                 {'C', "SHORT_BINBYTES"},
                                                                 {0x8c, "SHORT_BINUNICODE"},
                                                                 {0x8d, "BINUNICODE8"},
                                                                 {0x8e, "BINBYTES8"},
                                                                 {0x8f, "EMPTY_SET"},
                                                                 {0x90, "ADDITEMS"},
                                                                 {0x91, "FROZENSET"},
                                                                 {0x92, "NEWOBJ_EX"},
                                                                 {0x93, "STACK_GLOBAL"},
                                                                 {0x94, "MEMOIZE"},
                                                                 {0x95, "FRAME"},
                                                                 {0x96, "BYTEARRAY8"},
                                                                 {0x97, "NEXT_BUFFER"},
                                                                 {0x98, "READONLY_BUFFER"}};
  auto it = names.find(op);
  return it == names.end() ? "unknown" : it->second;
}

PickleRef make(Kind kind) {
  auto v = std::make_shared<PickleValue>();
  v->kind = kind;
  return v;
}

PickleRef make_int(Kind kind, int64_t value) {
  PickleRef v = make(kind);
  v->integer = value;
  return v;
}

PickleRef make_text(Kind kind, std::string_view text) {
  PickleRef v = make(kind);
  v->text = std::string(text);
  return v;
}

PickleRef make_sequence(Kind kind, std::vector<PickleRef> items) {
  PickleRef v = make(kind);
  v->items = std::move(items);
  return v;
}

class Unpickler {
 public:
  Unpickler(std::string_view bytes, const std::string& what, const StorageBytes& storage_bytes)
      : in_(bytes, what + ": data.pkl"), what_(what), storage_bytes_(storage_bytes) {}

  PickleRef run() {
    while (true) {
      op_position_ = in_.position();
      const uint8_t op = in_.u8();
      if (op == '.') break;
      execute(op);
    }
    SD_CHECK(stack_.size() == 1 && marks_.empty(), "{}: corrupt pickle: {} values left on the stack at STOP", what_,
             stack_.size());
    return stack_.back();
  }

 private:
  void execute(uint8_t op) {
    switch (op) {
      case 0x80: in_.u8(); return;   // PROTO
      case 0x95: in_.u64(); return;  // FRAME: a length hint
      case '(': marks_.push_back(stack_.size()); return;
      case '0': pop(); return;
      case 'N': push(make(Kind::kNone)); return;
      case 0x88: push(make_int(Kind::kBool, 1)); return;
      case 0x89: push(make_int(Kind::kBool, 0)); return;
      case 'J': push(make_int(Kind::kInt, in_.i32())); return;
      case 'K': push(make_int(Kind::kInt, in_.u8())); return;
      case 'M': push(make_int(Kind::kInt, in_.u16())); return;
      case 0x8a: push(make_int(Kind::kInt, read_long(in_.u8()))); return;
      case 'G': push(read_float()); return;
      case 'X': push(make_text(Kind::kString, in_.take(in_.u32()))); return;
      case 0x8c: push(make_text(Kind::kString, in_.take(in_.u8()))); return;
      case 0x8d: push(make_text(Kind::kString, in_.take(in_.u64()))); return;
      case 'B': push(make_text(Kind::kBytes, in_.take(in_.u32()))); return;
      case 'C': push(make_text(Kind::kBytes, in_.take(in_.u8()))); return;
      case ')': push(make(Kind::kTuple)); return;
      case 't': push(make_sequence(Kind::kTuple, pop_to_mark())); return;
      case 0x85: push(make_sequence(Kind::kTuple, pop_n(1))); return;
      case 0x86: push(make_sequence(Kind::kTuple, pop_n(2))); return;
      case 0x87: push(make_sequence(Kind::kTuple, pop_n(3))); return;
      case ']': push(make(Kind::kList)); return;
      case 'l': push(make_sequence(Kind::kList, pop_to_mark())); return;
      case 'a': append({pop()}); return;
      case 'e': append(pop_to_mark()); return;
      case '}': push(make(Kind::kDict)); return;
      case 'd': {
        const std::vector<PickleRef> keys_and_values = pop_to_mark();
        push(make(Kind::kDict));
        set_items(keys_and_values);
        return;
      }
      case 's': set_items(pop_n(2)); return;
      case 'u': set_items(pop_to_mark()); return;
      case 'q': memoize(in_.u8()); return;
      case 'r': memoize(in_.u32()); return;
      case 0x94: memoize(memo_.size()); return;
      case 'h': push(recall(in_.u8())); return;
      case 'j': push(recall(in_.u32())); return;
      case 'c': {
        const std::string module = read_line(), name = read_line();
        push(global(module + "." + name));
        return;
      }
      case 0x93: {
        const PickleRef name = pop(), module = pop();
        SD_CHECK(module->kind == Kind::kString && name->kind == Kind::kString,
                 "{}: corrupt pickle: STACK_GLOBAL needs two strings", what_);
        push(global(module->text + "." + name->text));
        return;
      }
      case 'R': {
        const PickleRef args = pop(), callable = pop();
        push(reduce(*callable, *args));
        return;
      }
      case 'b': build(pop()); return;
      case 'Q': push(persistent_load(*pop())); return;
      default:
        fail(
            "{}: refusing to load: pickle opcode {} (0x{:02x}) at byte {} is not one torch.save writes for a state "
            "dict",
            what_, opcode_name(op), op, op_position_);
    }
  }

  // --- the stack, marks and memo ---

  void push(PickleRef value) { stack_.push_back(std::move(value)); }

  PickleRef pop() {
    SD_CHECK(stack_.size() > floor(), "{}: corrupt pickle: stack underflow at byte {}", what_, op_position_);
    PickleRef value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }

  std::vector<PickleRef> pop_n(size_t n) {
    SD_CHECK(stack_.size() >= floor() + n, "{}: corrupt pickle: stack underflow at byte {}", what_, op_position_);
    std::vector<PickleRef> out(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }

  std::vector<PickleRef> pop_to_mark() {
    SD_CHECK(!marks_.empty(), "{}: corrupt pickle: no MARK before the opcode at byte {}", what_, op_position_);
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleRef> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }

  // Values below the innermost MARK belong to an enclosing opcode.
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }

  PickleRef& top() {
    SD_CHECK(stack_.size() > floor(), "{}: corrupt pickle: stack underflow at byte {}", what_, op_position_);
    return stack_.back();
  }

  void memoize(uint64_t index) { memo_[index] = top(); }

  PickleRef recall(uint64_t index) {
    auto it = memo_.find(index);
    SD_CHECK(it != memo_.end(), "{}: corrupt pickle: memo entry {} used before it was stored (byte {})", what_, index,
             op_position_);
    return it->second;
  }

  void append(const std::vector<PickleRef>& items) {
    PickleValue& list = *top();
    SD_CHECK(list.kind == Kind::kList, "{}: corrupt pickle: APPEND to something that is not a list (byte {})", what_,
             op_position_);
    list.items.insert(list.items.end(), items.begin(), items.end());
  }

  void set_items(const std::vector<PickleRef>& keys_and_values) {
    PickleValue& dict = *top();
    SD_CHECK(dict.kind == Kind::kDict && keys_and_values.size() % 2 == 0,
             "{}: corrupt pickle: SETITEM(S) needs a dict and key/value pairs (byte {})", what_, op_position_);
    for (size_t i = 0; i < keys_and_values.size(); i += 2)
      dict.entries.emplace_back(keys_and_values[i], keys_and_values[i + 1]);
  }

  // --- scalars ---

  // LONG1: an n-byte little-endian two's complement integer.
  int64_t read_long(uint8_t n) {
    SD_CHECK(n <= 8, "{}: integer of {} bytes at byte {} does not fit 64 bits", what_, n, op_position_);
    std::string_view raw = in_.take(n);
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(raw[i])) << (8 * i);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(raw[n - 1]) & 0x80)) value |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(value);
  }

  PickleRef read_float() {  // BINFLOAT: a big-endian IEEE double
    std::string_view raw = in_.take(8);
    uint64_t bits = 0;
    for (char c : raw) bits = (bits << 8) | static_cast<uint8_t>(c);
    PickleRef v = make(Kind::kFloat);
    std::memcpy(&v->real, &bits, sizeof bits);
    return v;
  }

  std::string read_line() {
    std::string line;
    for (char c = static_cast<char>(in_.u8()); c != '\n'; c = static_cast<char>(in_.u8())) {
      line += c;
      SD_CHECK(line.size() <= 256, "{}: corrupt pickle: GLOBAL name longer than 256 bytes at byte {}", what_,
               op_position_);
    }
    return line;
  }

  // --- objects ---

  PickleRef global(const std::string& name) {
    SD_CHECK(allowed_globals().count(name),
             "{}: refusing to load: the pickle asks for the Python object '{}' (byte {}), which is not part of a "
             "torch.save state dict; only tensors and plain containers are read",
             what_, name, op_position_);
    return make_text(Kind::kGlobal, name);
  }

  PickleRef reduce(const PickleValue& callable, const PickleValue& args) {
    SD_CHECK(callable.kind == Kind::kGlobal || callable.kind == Kind::kInert,
             "{}: refusing to load: REDUCE at byte {} calls something that is not an allowed global", what_,
             op_position_);
    SD_CHECK(args.kind == Kind::kTuple, "{}: corrupt pickle: REDUCE arguments are not a tuple (byte {})", what_,
             op_position_);
    if (callable.kind == Kind::kInert) return make_text(Kind::kInert, callable.text);
    switch (allowed_globals().at(callable.text).what) {
      case Allowed::kOrderedDict:
        SD_CHECK(args.items.empty(), "{}: refusing to load: OrderedDict built from arguments (byte {})", what_,
                 op_position_);
        return make(Kind::kDict);
      case Allowed::kRebuildTensor: return rebuild_tensor(args.items);
      case Allowed::kRebuildParameter:
        SD_CHECK(!args.items.empty() && args.items[0]->kind == Kind::kTensor,
                 "{}: corrupt pickle: _rebuild_parameter without a tensor (byte {})", what_, op_position_);
        return args.items[0];
      case Allowed::kRestoreTypeTag:
        SD_CHECK(args.items.size() == 2, "{}: corrupt pickle: restore_type_tag at byte {} needs (value, type)", what_,
                 op_position_);
        return args.items[0];
      case Allowed::kInert: return make_text(Kind::kInert, callable.text);
      case Allowed::kStorageType: break;
    }
    fail("{}: refusing to load: the pickle calls {} (byte {}), which torch.save never does", what_, callable.text,
         op_position_);
  }

  // BUILD sets an object's state: an OrderedDict's state is its __dict__ (the state dict's `_metadata` of module
  // versions), which sdtrain does not need; inert objects stay inert.
  void build(const PickleRef& state) {
    const PickleValue& object = *top();
    SD_CHECK(object.kind == Kind::kDict || object.kind == Kind::kInert,
             "{}: refusing to load: BUILD at byte {} sets the state of something other than a dict", what_,
             op_position_);
  }

  // torch's persistent id of a storage: ('storage', torch.<Type>Storage, key, location, numel).
  PickleRef persistent_load(const PickleValue& pid) {
    const auto& f = pid.items;
    SD_CHECK(pid.kind == Kind::kTuple && f.size() == 5 && f[0]->kind == Kind::kString && f[0]->text == "storage" &&
                 f[1]->kind == Kind::kGlobal && f[2]->kind == Kind::kString && f[4]->kind == Kind::kInt,
             "{}: refusing to load: persistent id at byte {} is not a torch storage record", what_, op_position_);
    const AllowedGlobal& type = allowed_globals().at(f[1]->text);
    SD_CHECK(type.what == Allowed::kStorageType, "{}: refusing to load: persistent id names {}, not a storage type",
             what_, f[1]->text);
    PickleRef v = make(Kind::kStorage);
    v->storage = {f[2]->text, type.dtype, f[4]->integer};
    const uint64_t element_size = c10::elementSize(type.dtype);
    const uint64_t stored = storage_bytes_(v->storage.key);
    SD_CHECK(v->storage.numel >= 0 && static_cast<uint64_t>(v->storage.numel) == stored / element_size &&
                 stored % element_size == 0,
             "{}: storage '{}' should hold {} {} elements but its entry has {} bytes", what_, v->storage.key,
             v->storage.numel, c10::toString(type.dtype), stored);
    return v;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]).
  PickleRef rebuild_tensor(const std::vector<PickleRef>& args) {
    SD_CHECK((args.size() == 6 || args.size() == 7) && args[0]->kind == Kind::kStorage && args[1]->kind == Kind::kInt &&
                 args[2]->kind == Kind::kTuple && args[3]->kind == Kind::kTuple && args[5]->kind == Kind::kDict,
             "{}: corrupt pickle: _rebuild_tensor_v2 at byte {} has unexpected arguments", what_, op_position_);
    PickleRef v = make(Kind::kTensor);
    TorchTensorView& view = v->tensor;
    view.storage = args[0]->storage;
    view.offset = args[1]->integer;
    view.size = int_tuple(*args[2]);
    view.stride = int_tuple(*args[3]);
    SD_CHECK(view.size.size() == view.stride.size(), "{}: tensor view at byte {} has {} sizes but {} strides", what_,
             op_position_, view.size.size(), view.stride.size());
    check_inside_storage(view);
    return v;
  }

  std::vector<int64_t> int_tuple(const PickleValue& tuple) {
    std::vector<int64_t> out;
    for (const auto& item : tuple.items) {
      SD_CHECK(item->kind == Kind::kInt && item->integer >= 0,
               "{}: tensor view at byte {} has a size or stride that is not a non-negative integer", what_,
               op_position_);
      out.push_back(item->integer);
    }
    return out;
  }

  void check_inside_storage(const TorchTensorView& view) {
    // A view may repeat elements (stride 0), so it can be larger than its storage: it is materialised when read,
    // hence bounded, with its size in bytes computed without overflow.
    int64_t numel = 1, bytes = 0;
    bool overflow = false;
    for (int64_t d : view.size) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    overflow =
        overflow || __builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(view.storage.dtype)), &bytes);
    const int64_t storage_bytes = view.storage.numel * static_cast<int64_t>(c10::elementSize(view.storage.dtype));
    SD_CHECK(!overflow && bytes <= std::max<int64_t>(storage_bytes, int64_t{1} << 30),
             "{}: tensor view at byte {} (size [{}]) repeats its storage '{}' of {} elements into more than 1 GiB",
             what_, op_position_, fmt::join(view.size, ", "), view.storage.key, view.storage.numel);
    const std::optional<int64_t> span = view.span();
    SD_CHECK(view.offset >= 0 && span && view.offset <= view.storage.numel && *span <= view.storage.numel - view.offset,
             "{}: tensor view at byte {} (offset {}, size [{}], stride [{}]) reaches outside storage '{}' of {} "
             "elements",
             what_, op_position_, view.offset, fmt::join(view.size, ", "), fmt::join(view.stride, ", "),
             view.storage.key, view.storage.numel);
  }

  ByteReader in_;
  std::string what_;
  const StorageBytes& storage_bytes_;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleRef> memo_;
  size_t op_position_ = 0;
};

}  // namespace

std::optional<int64_t> TorchTensorView::span() const {
  int64_t last = 0;  // the offset of the last element, from the first
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 0) return 0;
    int64_t reach = 0;
    if (__builtin_mul_overflow(size[d] - 1, stride[d], &reach) || __builtin_add_overflow(last, reach, &last))
      return std::nullopt;
  }
  return last == INT64_MAX ? std::nullopt : std::optional<int64_t>(last + 1);
}

PickleRef unpickle_torch(std::string_view bytes, const std::string& what, const StorageBytes& storage_bytes) {
  return Unpickler(bytes, what, storage_bytes).run();
}

}  // namespace sd::io
