// PlanRegistrar (sidecar/include/granary/sidecar/plan_registrar.h) over a real
// SQLite store that another connection holds locked, as a store busy with
// other daemons' writes is: Register returns at once, plans of the same id
// queued meanwhile are written once (the newest), a full queue refuses with
// an error that says why, and everything queued is written once the lock goes.

#include "granary/sidecar/plan_registrar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "granary/store/open_store.h"
#include "testing/test_util.h"

namespace granary::sidecar {
namespace {

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

  void Lock() {
    ASSERT_EQ(sqlite3_open(dir_.Join("granary.db").c_str(), &other_), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  void Unlock() {
    ASSERT_EQ(sqlite3_exec(other_, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(other_);
    other_ = nullptr;
  }
  void TearDown() override {
    if (other_ != nullptr) sqlite3_close(other_);
  }

  static PlanRecord Plan(const std::string& id, uint64_t seed) {
    PlanRecord plan;
    plan.plan_id = id;
    plan.seed = seed;
    return plan;
  }

  TempDir dir_;
  std::unique_ptr<MetadataStore> store_;
  sqlite3* other_ = nullptr;
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
  Lock();
  registrar.Register("images", Plan("job-a", 1));
  registrar.Register("images", Plan("job-b", 2));
  // While job-a's first write may already wait on the lock, the later
  // records of job-a and job-b replace queued ones or queue once more.
  registrar.Register("images", Plan("job-b", 3));
  registrar.Register("images", Plan("job-a", 4));
  // (The store object is the one the registrar writes through: asking it now
  // would wait behind that write.)
  EXPECT_EQ(registrar.completed(), 0u) << "nothing is written while the lock is held";
  Unlock();

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
  auto registrar = std::make_unique<PlanRegistrar>(store_.get(), on_error_);
  Lock();
  // One more than can wait: the first may be taken off the queue by the
  // thread (and wait on the lock there), so two more than that.
  for (size_t i = 0; i < kMaxPendingPlans + 2; ++i) {
    registrar->Register("images", Plan("job-" + std::to_string(i), i));
  }
  {
    std::lock_guard<std::mutex> lock(errors_mu_);
    ASSERT_GE(errors_.size(), 1u);
    EXPECT_THAT(errors_.back(), HasSubstr("images job-" + std::to_string(kMaxPendingPlans + 1)));
    EXPECT_THAT(errors_.back(), HasSubstr("plans are already waiting for the store"));
    EXPECT_THAT(errors_.back(), HasSubstr("check the store's health"));
  }
  // A plan of a dataset the store does not have: its write fails, reported.
  Unlock();
  registrar->Flush();
  registrar->Register("no-such-dataset", Plan("job-x", 1));
  registrar.reset();  // writes what is queued, then stops
  std::lock_guard<std::mutex> lock(errors_mu_);
  EXPECT_THAT(errors_.back(), HasSubstr("no-such-dataset job-x"));
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  EXPECT_GE(plans->size(), kMaxPendingPlans);
}

}  // namespace
}  // namespace granary::sidecar
