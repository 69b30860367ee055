// A non-owning reference to a callable, for callbacks that run only within the call that receives
// them (a collective's body, the header exchange's hooks): unlike std::function it never
// allocates, whatever the lambda captures. The referenced callable must outlive every call made
// through the reference; bind named lambdas, never a temporary that a later statement would call.
#pragma once
#include <memory>
#include <type_traits>
#include <utility>

namespace rc {

template <class Sig>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  FunctionRef() = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F& f) noexcept  // NOLINT(google-explicit-constructor): a reference, as a parameter type
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* o, Args... a) -> R {
          return (*static_cast<F*>(o))(std::forward<Args>(a)...);
        }) {}

  explicit operator bool() const noexcept { return call_ != nullptr; }
  R operator()(Args... a) const { return call_(obj_, std::forward<Args>(a)...); }

 private:
  void* obj_ = nullptr;
  R (*call_)(void*, Args...) = nullptr;
};

}  // namespace rc
