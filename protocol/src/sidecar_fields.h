#pragma once

// The vocabulary in which sidecar_messages.h describes each sidecar protocol
// message body once, and the three visitors that walk those descriptions:
// BodyWriter (encode), BodyReader (decode) and RuleChecker (the rules an
// encoder refuses and a decoder rejects). So a field added to a description is
// encoded, decoded and checked; nothing else lists a body's fields.
//
// A description is a function `Fields(V& v, M& m)` (M const or not) calling,
// in wire order:
//   v.Int(name, field [, rule])            a fixed-size integer
//   v.Bool(name, field)                    u8, 0 or 1
//   v.String(name, field, max [, rule])    u16 length + bytes; a decoder
//                                          rejects more than max (kOutOfRange)
//   v.ManifestId(name, field [, rule])     16 bytes, ContentId::ToBytes
//   v.Flag(name, field, bit, bit_name)     an integer of flag bits (its type
//                                          is bit's) with one bit defined
//   v.Count(name, list, min_size)          u32 element count of `list`; a
//                                          decoder checks it against max_items
//                                          and against the bytes left at
//                                          min_size each, then sizes `list`
//   v.Each(name, list, describe_element)   the elements, later in the body
//   v.StatusCode(name, status)             u16 wire code of a status
//   v.StatusMessage(name, status)          its message string (empty if OK)
//   v.WireStatus(name, status)             both
//   v.Rule(rule)                           a rule over several fields
//   v.FitMessages(items, fixed, each)      encoder only: cut the items' status
//                                          messages so the body fits
// A rule is a callable `Status(std::string_view field)`, run only by
// RuleChecker: `field` is the name given, or "list[i]" inside Each. It returns
// OK or an error naming the field (FieldInvalid, FieldRange). Decoder errors
// name fields as "name", or "list.name" inside Each.
//
// Visitors are sticky: after the first error every call is a no-op; the
// caller reads status() (and adds the message type and request id).
//
// Thread safety: a visitor is a local of one encode or decode call.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/hash.h"
#include "granary/core/status.h"
#include "granary/protocol/sidecar_protocol.h"

namespace granary::sidecar_protocol::fields {

namespace sf = sidecar_protocol_format;

// Field rule errors: "<field>: <what>".
Status FieldInvalid(std::string_view field, const std::string& what);
Status FieldRange(std::string_view field, const std::string& what);
// The same error with `prefix` before its message (the code is kept).
Status Prefixed(const std::string& prefix, const Status& s);
// "items[3]".
std::string Indexed(std::string_view list, size_t i);

// Rules shared by several messages.
Status CheckName(std::string_view field, std::string_view name);  // 1..255 graphic ASCII
Status CheckPath(std::string_view field, std::string_view path);  // 1..kMaxPathLength bytes
Status CheckToken(std::string_view field, uint64_t token);        // not 0
// 1..limits.max_items entries asked for.
Status CheckAskedCount(std::string_view field, uint32_t count, const Limits& limits);
// [first, first + count) within the u32 index space.
Status CheckIndexRange(std::string_view field, std::string_view what, uint32_t first,
                       uint64_t count);

// No rule: the default of every rule parameter.
struct NoRule {};

// What every visitor has: the receiver's limits, the sticky error, and
// where inside a list it is.
class FieldVisitor {
 public:
  explicit FieldVisitor(const Limits& limits) : limits_(limits) {}
  const Limits& limits() const { return limits_; }
  const Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }

 protected:
  void Fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
  }
  // Walks `list` with `list_`/`index_` naming each element.
  template <class L, class F>
  void Walk(std::string_view name, L& list, F& describe) {
    std::string_view outer = list_;
    list_ = name;
    for (size_t i = 0; i < list.size() && ok(); ++i) {
      index_ = i;
      describe(list[i]);
    }
    list_ = outer;
  }

  const Limits& limits_;
  Status status_;
  std::string_view list_;  // inside Each: the list's name
  size_t index_ = 0;
};

// Encodes a body. Fields were checked (RuleChecker) before: it cannot fail.
class BodyWriter : public FieldVisitor {
 public:
  BodyWriter(const Limits& limits, std::string* out) : FieldVisitor(limits), w_(out) {}

  template <class T, class R = NoRule>
  void Int(std::string_view, const T& v, R&& = {}) {
    w_.Put(v);
  }
  void Bool(std::string_view, bool v) { w_.Put(static_cast<uint8_t>(v ? 1 : 0)); }
  template <class R = NoRule>
  void String(std::string_view, const std::string& s, size_t, R&& = {}) {
    PutString(s);
  }
  template <class R = NoRule>
  void ManifestId(std::string_view, const ContentId& id, R&& = {}) {
    PutManifestId(id);
  }
  template <class T>
  void Flag(std::string_view, bool v, T bit, std::string_view) {
    w_.Put(v ? bit : T{0});
  }
  template <class L>
  void Count(std::string_view, const L& list, size_t) {
    w_.Put(static_cast<uint32_t>(list.size()));
  }
  template <class L, class F>
  void Each(std::string_view name, const L& list, F&& describe) {
    Walk(name, list, describe);
  }
  void StatusCode(std::string_view, const Status& s);
  void StatusMessage(std::string_view, const Status& s);
  void WireStatus(std::string_view name, const Status& s) {
    StatusCode(name, s);
    StatusMessage(name, s);
  }
  template <class R>
  void Rule(R&&) {}
  // The failed items' messages share what the body limit leaves: a reply to
  // a valid request always fits (at most kMaxMessageLength each).
  template <class L>
  void FitMessages(const L& items, size_t fixed_size, size_t item_min_size) {
    std::vector<size_t> lengths;
    lengths.reserve(items.size());
    for (const auto& item : items) {
      lengths.push_back(item.status.ok() ? 0 : item.status.message().size());
    }
    message_budget_ = MessageBudget(fixed_size + items.size() * item_min_size, lengths);
  }

 private:
  void PutString(std::string_view s);
  void PutManifestId(const ContentId& id);
  size_t MessageBudget(size_t fixed, const std::vector<size_t>& lengths) const;

  ByteWriter w_;
  size_t message_budget_ = sf::kMaxMessageLength;
};

// Decodes a body into a message, checking what the wire alone says (lengths,
// counts against the limits and the bytes left, 0/1 booleans, known flag
// bits, status codes); the rules are RuleChecker's.
class BodyReader : public FieldVisitor {
 public:
  BodyReader(const Limits& limits, std::string_view body)
      : FieldVisitor(limits), body_size_(body.size()), reader_(body) {}

  template <class T, class R = NoRule>
  void Int(std::string_view name, T& v, R&& = {}) {
    if (ok() && !reader_.Get(&v)) Truncated(name);
  }
  void Bool(std::string_view name, bool& v);
  template <class R = NoRule>
  void String(std::string_view name, std::string& s, size_t max_length, R&& = {}) {
    ReadString(name, &s, max_length);
  }
  template <class R = NoRule>
  void ManifestId(std::string_view name, ContentId& id, R&& = {}) {
    ReadManifestId(name, &id);
  }
  template <class T>
  void Flag(std::string_view name, bool& v, T bit, std::string_view bit_name) {
    T flags = 0;
    Int(name, flags);
    if (!ok()) return;
    if ((flags & ~bit) != 0) {
      UnknownFlags(name, flags, bit, bit_name);
      return;
    }
    v = (flags & bit) != 0;
  }
  template <class L>
  void Count(std::string_view name, L& list, size_t min_size) {
    uint32_t n = 0;
    if (ReadCount(name, &n, min_size)) list.resize(n);
  }
  template <class L, class F>
  void Each(std::string_view name, L& list, F&& describe) {
    Walk(name, list, describe);
  }
  void StatusCode(std::string_view name, Status& s);
  void StatusMessage(std::string_view name, Status& s);
  void WireStatus(std::string_view name, Status& s) {
    StatusCode(name, s);
    StatusMessage(name, s);
  }
  template <class R>
  void Rule(R&&) {}
  template <class L>
  void FitMessages(const L&, size_t, size_t) {}

  // After the last field: the body must end there.
  void End();

 private:
  std::string Name(std::string_view name) const;  // "items.id" inside Each
  void Truncated(std::string_view name);
  void ReadString(std::string_view name, std::string* s, size_t max_length);
  void ReadManifestId(std::string_view name, ContentId* id);
  bool ReadCount(std::string_view name, uint32_t* n, size_t min_size);
  void UnknownFlags(std::string_view name, uint64_t flags, uint64_t bit, std::string_view bit_name);

  size_t body_size_;
  ByteReader reader_;
  uint16_t status_code_ = 0;  // StatusCode's, until StatusMessage
};

// Runs the rules: what an encoder refuses and a decoder rejects.
class RuleChecker : public FieldVisitor {
 public:
  explicit RuleChecker(const Limits& limits) : FieldVisitor(limits) {}

  template <class T, class R = NoRule>
  void Int(std::string_view name, const T&, R&& rule = {}) {
    Apply(name, rule);
  }
  void Bool(std::string_view, bool) {}
  template <class R = NoRule>
  void String(std::string_view name, const std::string&, size_t, R&& rule = {}) {
    Apply(name, rule);
  }
  template <class R = NoRule>
  void ManifestId(std::string_view name, const ContentId&, R&& rule = {}) {
    Apply(name, rule);
  }
  template <class T>
  void Flag(std::string_view, bool, T, std::string_view) {}
  template <class L>
  void Count(std::string_view name, const L& list, size_t) {
    CheckCount(name, list.size());
  }
  template <class L, class F>
  void Each(std::string_view name, const L& list, F&& describe) {
    Walk(name, list, describe);
  }
  void StatusCode(std::string_view, const Status&) {}
  void StatusMessage(std::string_view, const Status&) {}
  void WireStatus(std::string_view, const Status&) {}
  template <class R>
  void Rule(R&& rule) {
    Apply("", rule);
  }
  template <class L>
  void FitMessages(const L&, size_t, size_t) {}

 private:
  template <class R>
  void Apply(std::string_view name, R& rule) {
    if constexpr (!std::is_same_v<std::decay_t<R>, NoRule>) {
      if (!ok()) return;
      Fail(rule(std::string_view(Name(name))));
    }
  }
  std::string Name(std::string_view name) const;  // "items[3]" inside Each
  void CheckCount(std::string_view name, size_t count);
};

}  // namespace granary::sidecar_protocol::fields
