// PlanRegistrar (plan_registrar.h): SET_PLAN's write to the store, off the
// request path.

#include "granary/sidecar/plan_registrar.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "granary/core/thread_name.h"

namespace granary::sidecar {

PlanRegistrar::PlanRegistrar(MetadataStore* store, ErrorFn on_error)
    : store_(store), on_error_(std::move(on_error)), thread_([this] { Loop(); }) {}

PlanRegistrar::~PlanRegistrar() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void PlanRegistrar::Register(std::string dataset, PlanRecord plan) {
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto same = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) {
      return p.dataset == dataset && p.plan.plan_id == plan.plan_id;
    });
    if (same != queue_.end()) {
      same->plan = std::move(plan);  // not written yet: the newest record wins
      return;
    }
    if (queue_.size() >= kMaxPendingPlans) {
      refused = true;
    } else {
      queue_.push_back(Pending{std::move(dataset), std::move(plan)});
      ++queued_;
    }
  }
  if (refused) {
    // A store that does not keep up with distinct plans: this one is not
    // written now (the sidecar's prefetch has it; its next SET_PLAN tries again).
    if (on_error_) {
      on_error_(dataset, plan,
                Status::ResourceExhausted(fmt::format(
                    "{} plans are already waiting for the store; this one is not registered "
                    "now (check the store's health and latency)",
                    kMaxPendingPlans)));
    }
    return;
  }
  work_cv_.notify_one();
}

size_t PlanRegistrar::Flush(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queued_;
  done_cv_.wait_until(lock, deadline, [&] { return completed_ >= target; });
  return completed_ >= target ? 0 : static_cast<size_t>(target - completed_);
}

uint64_t PlanRegistrar::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

size_t PlanRegistrar::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void PlanRegistrar::Loop() {
  NameThisThread("plan-registrar");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    // Stopping drops what is queued (the owner flushed first, for as long
    // as it would wait): a store that stopped answering holds up no exit.
    if (stopping_) return;
    Pending next = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Status put = store_->PutPlan(next.dataset, next.plan);
    if (!put.ok() && on_error_) on_error_(next.dataset, next.plan, put);
    lock.lock();
    ++completed_;
    done_cv_.notify_all();
  }
}

}  // namespace granary::sidecar
