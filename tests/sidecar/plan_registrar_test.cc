// PlanRegistrar (sidecar/include/granary/sidecar/plan_registrar.h) over a real
// SQLite store that another connection holds locked, as a store busy with
// other daemons' writes is: Register returns at once, plans of the same id
// queued meanwhile are written once (the newest), a full queue refuses with
// an error that says why, Flush gives up at its deadline, destruction drops
// what is left, and everything queued is written once the lock goes.

#include "granary/sidecar/plan_registrar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "granary/store/open_store.h"
#include "testing/sqlite_lock.h"
#include "testing/test_util.h"

namespace granary::sidecar {
namespace {

using ::granary::testing::SqliteWriteLock;
using ::granary::testing::TempDir;
using ::testing::HasSubstr;

class PlanRegistrarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A minute of busy timeout: longer than any wait below, so a write that
    // happened while the lock was held would show.
    Result<std::unique_ptr<MetadataStore>> store =
        OpenMetadataStore("sqlite://" + dir_.Join("granary.db") + "?retry_ms=60000");
    ASSERT_OK(store);
    store_ = std::move(*store);
    DatasetRecord record;
    record.name = "images";
    record.spec.source_uri = "file://" + dir_.Join("source");
    record.spec.pool = "default";
    record.owner = DatasetOwner{::getuid(), ::getgid()};
    ASSERT_OK(store_->CreateDataset(record).status());
  }

  static PlanRecord Plan(const std::string& id, uint64_t seed) {
    PlanRecord plan;
    plan.plan_id = id;
    plan.seed = seed;
    return plan;
  }

  TempDir dir_;
  std::unique_ptr<MetadataStore> store_;
  std::mutex errors_mu_;
  std::vector<std::string> errors_;  // "<dataset> <plan_id>: <status>"
  PlanRegistrar::ErrorFn on_error_ = [this](const std::string& dataset, const PlanRecord& plan,
                                            const Status& failed) {
    std::lock_guard<std::mutex> lock(errors_mu_);
    errors_.push_back(dataset + " " + plan.plan_id + ": " + failed.ToString());
  };
};

TEST_F(PlanRegistrarTest, QueuesWhileTheStoreIsLockedAndWritesTheNewestOfEachPlanOnce) {
  PlanRegistrar registrar(store_.get(), on_error_);
  SqliteWriteLock lock(dir_.Join("granary.db"));
  registrar.Register("images", Plan("job-a", 1));
  registrar.Register("images", Plan("job-b", 2));
  // While job-a's first write may already wait on the lock, the later
  // records of job-a and job-b replace queued ones or queue once more.
  registrar.Register("images", Plan("job-b", 3));
  registrar.Register("images", Plan("job-a", 4));
  // (The store object is the one the registrar writes through: asking it now
  // would wait behind that write.)
  EXPECT_EQ(registrar.completed(), 0u) << "nothing is written while the lock is held";
  lock.Unlock();

  registrar.Flush();
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  ASSERT_EQ(plans->size(), 2u);
  EXPECT_EQ((*plans)[0].plan_id, "job-a");
  EXPECT_EQ((*plans)[0].seed, 4u) << "the newest record of job-a";
  EXPECT_EQ((*plans)[1].plan_id, "job-b");
  EXPECT_EQ((*plans)[1].seed, 3u) << "the newest record of job-b";
  EXPECT_LE(registrar.completed(), 3u) << "job-b was written once";
  EXPECT_TRUE(errors_.empty());
}

TEST_F(PlanRegistrarTest, AFullQueueRefusesWithAnErrorAndAFailedWriteIsReported) {
  PlanRegistrar registrar(store_.get(), on_error_);
  SqliteWriteLock lock(dir_.Join("granary.db"));
  // The first is taken off the queue by the registrar's thread, which waits
  // on the lock with it; then the queue fills, and one more is refused.
  registrar.Register("images", Plan("job-first", 0));
  ASSERT_TRUE(testing::WaitFor([&] { return registrar.pending() == 0; }));
  for (size_t i = 0; i < kMaxPendingPlans; ++i) {
    registrar.Register("images", Plan("job-" + std::to_string(i), i));
  }
  EXPECT_EQ(registrar.pending(), kMaxPendingPlans);
  {
    std::lock_guard<std::mutex> errors_lock(errors_mu_);
    EXPECT_TRUE(errors_.empty());
  }
  registrar.Register("images", Plan("job-refused", 1));
  registrar.Register("images", Plan("job-0", 7));  // queued already: replaced, not refused
  {
    std::lock_guard<std::mutex> errors_lock(errors_mu_);
    ASSERT_EQ(errors_.size(), 1u);
    EXPECT_THAT(errors_[0], HasSubstr("images job-refused"));
    EXPECT_THAT(errors_[0], HasSubstr("1024 plans are already waiting for the store"));
    EXPECT_THAT(errors_[0], HasSubstr("check the store's health"));
  }
  // Flush gives up at its deadline, saying how many are not written.
  EXPECT_EQ(registrar.Flush(std::chrono::steady_clock::now() + std::chrono::milliseconds(200)),
            kMaxPendingPlans + 1);

  lock.Unlock();
  EXPECT_EQ(registrar.Flush(), 0u);
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  EXPECT_EQ(plans->size(), kMaxPendingPlans + 1) << "every queued plan, none refused";
  for (const PlanRecord& plan : *plans) {
    if (plan.plan_id == "job-0") {
      EXPECT_EQ(plan.seed, 7u);
    }
    EXPECT_NE(plan.plan_id, "job-refused");
  }

  // A plan of a dataset the store does not have: the failed write is reported.
  registrar.Register("no-such-dataset", Plan("job-x", 1));
  EXPECT_EQ(registrar.Flush(), 0u);
  std::lock_guard<std::mutex> errors_lock(errors_mu_);
  ASSERT_EQ(errors_.size(), 2u);
  EXPECT_THAT(errors_[1], HasSubstr("no-such-dataset job-x"));
}

TEST_F(PlanRegistrarTest, DestructionDropsWhatIsQueuedInsteadOfWaitingForTheStore) {
  auto registrar = std::make_unique<PlanRegistrar>(store_.get(), on_error_);
  SqliteWriteLock lock(dir_.Join("granary.db"));
  registrar->Register("images", Plan("job-in-flight", 0));
  ASSERT_TRUE(testing::WaitFor([&] { return registrar->pending() == 0; }));
  for (int i = 0; i < 10; ++i) registrar->Register("images", Plan("job-" + std::to_string(i), 1));
  // The write in flight waits on the lock; let it go from another thread
  // after a moment, so that destruction has one write to wait for and ten
  // plans to drop.
  std::thread unlock([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    lock.Unlock();
  });
  registrar.reset();
  unlock.join();
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  ASSERT_EQ(plans->size(), 1u) << "the write in flight finished; the queued ten were dropped";
  EXPECT_EQ(plans->front().plan_id, "job-in-flight");
  EXPECT_TRUE(errors_.empty()) << "dropping at destruction is not a failed write";
}

}  // namespace
}  // namespace granary::sidecar
