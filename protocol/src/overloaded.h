#pragma once

// std::visit over a variant with one lambda per alternative:
//   std::visit(Overloaded{[](const A&) {...}, [](const B&) {...}}, v);

namespace granary {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace granary
