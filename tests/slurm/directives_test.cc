// The #DW directives of a Slurm job script (slurm/include/granary/slurm/directives.h) and
// `granary slurm validate` over a real SQLite store and real directories:
// every supported form, and every rule a bad script breaks, each with its
// line and reason.

#include "granary/slurm/directives.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "granary/cli/cli.h"
#include "granary/core/metadata_store.h"
#include "granary/store/open_store.h"
#include "testing/store_records.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using slurm::DirectiveParse;
using slurm::ParseJobDirectives;

// The errors of a parse as "line N: reason" strings.
std::vector<std::string> Errors(const DirectiveParse& parse) {
  std::vector<std::string> out;
  for (const slurm::DirectiveError& e : parse.errors) out.push_back(e.ToString());
  return out;
}

// Expects exactly one error, on `line`, whose text contains `part`.
void ExpectOneError(const std::string& script, int line, const std::string& part) {
  DirectiveParse parse = ParseJobDirectives(script);
  ASSERT_EQ(parse.errors.size(), 1u) << script << "\n" << ::testing::PrintToString(Errors(parse));
  EXPECT_EQ(parse.errors[0].line, line) << script;
  EXPECT_NE(parse.errors[0].reason.find(part), std::string::npos)
      << "wanted " << part << " in: " << parse.errors[0].reason;
}

constexpr const char* kJobDw =
    "#DW jobdw type=scratch access_mode=striped capacity=10GiB pool=gpu\n";

TEST(SlurmDirectivesTest, ParsesTheSupportedForms) {
  DirectiveParse parse = ParseJobDirectives(
      "#!/bin/bash\n"
      "#SBATCH -N 2\n"
      "#DW jobdw type=scratch access_mode=striped capacity=1.5TiB pool=gpu\n"
      "#DW stage_in type=directory source=/lustre/imagenet/train "
      "destination=$DW_JOB_STRIPED/imagenet\n"
      "#DW\tstage_in source=/lustre/val  destination=${DW_JOB_STRIPED}/val/\r\n"
      "#DW persistentdw name=coco\n"
      "srun python train.py  # #DW stage_out is only a comment here\n");
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  const slurm::JobDirectives& d = parse.directives;
  ASSERT_TRUE(d.jobdw.has_value());
  EXPECT_EQ(d.jobdw->line, 3);
  EXPECT_EQ(d.jobdw->capacity_bytes, 3ull << 39);
  EXPECT_EQ(d.jobdw->pool, "gpu");
  ASSERT_EQ(d.stage_ins.size(), 2u);
  EXPECT_EQ(d.stage_ins[0].line, 4);
  EXPECT_EQ(d.stage_ins[0].source, "/lustre/imagenet/train");
  EXPECT_EQ(d.stage_ins[0].name, "imagenet");
  EXPECT_EQ(d.stage_ins[1].line, 5);
  EXPECT_EQ(d.stage_ins[1].source, "/lustre/val");
  EXPECT_EQ(d.stage_ins[1].name, "val");
  ASSERT_EQ(d.persistent.size(), 1u);
  EXPECT_EQ(d.persistent[0].line, 6);
  EXPECT_EQ(d.persistent[0].name, "coco");
}

TEST(SlurmDirectivesTest, DefaultsAndLinesThatAreNotDirectives) {
  DirectiveParse parse = ParseJobDirectives(
      "#DW jobdw capacity=100GB pool=p1\n"
      "#DWX whatever\n"
      "  #DW stage_out not at the start of the line\n"
      "#BB create_persistent name=x\n");
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  ASSERT_TRUE(parse.directives.jobdw.has_value());
  EXPECT_EQ(parse.directives.jobdw->capacity_bytes, 100'000'000'000ull);
  EXPECT_EQ(parse.directives.jobdw->pool, "p1");

  EXPECT_TRUE(ParseJobDirectives("#!/bin/sh\necho hi\n").directives.empty());
  EXPECT_TRUE(ParseJobDirectives("").directives.empty());
}

// Slurm 22.05 itself refuses capacity= without pool=, with no line number.
TEST(SlurmDirectivesTest, PoolIsRequired) {
  ExpectOneError("#DW jobdw type=scratch access_mode=striped capacity=1GiB\n", 1,
                 "pool= is missing; Slurm needs a pool with capacity=");
}

TEST(SlurmDirectivesTest, UnsupportedDataWarpFormsSayNotSupported) {
  ExpectOneError("#DW stage_out type=directory source=$DW_JOB_STRIPED/o destination=/l/o\n", 1,
                 "#DW stage_out is not supported");
  ExpectOneError("#DW swap 10GiB\n", 1, "#DW swap is not supported");
  ExpectOneError("#DW create_persistent name=x capacity=1GiB pool=gpu\n", 1, "not supported");
  ExpectOneError("#DW destroy_persistent name=x\n", 1, "not supported");
  ExpectOneError("#DW jobdw type=cache access_mode=striped capacity=1GiB pool=gpu\n", 1,
                 "type=cache is not supported");
  ExpectOneError("#DW jobdw type=scratch access_mode=private capacity=1GiB pool=gpu\n", 1,
                 "access_mode=private is not supported");
  ExpectOneError("#DW jobdw type=scratch access_mode=striped,private capacity=1GiB pool=gpu\n", 1,
                 "is not supported");
  ExpectOneError(
      std::string(kJobDw) + "#DW stage_in type=file source=/a destination=" + "$DW_JOB_STRIPED/a\n",
      2, "type=file is not supported");
  ExpectOneError(
      std::string(kJobDw) + "#DW stage_in type=list source=/a destination=" + "$DW_JOB_STRIPED/a\n",
      2, "type=list is not supported");
}

TEST(SlurmDirectivesTest, UnknownDirectivesKeysAndValues) {
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu\n#DW stagein source=/a\n", 2,
                 "unknown directive #DW 'stagein'");
  ExpectOneError("#DW\n", 1, "#DW with no directive");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu colour=blue\n", 1, "unknown key 'colour'");
  ExpectOneError("#DW persistentdw name=a size=1\n", 1, "unknown key 'size'");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu striped\n", 1,
                 "expected key=value, found 'striped'");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu =x\n", 1, "expected key=value");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu type=\n", 1, "type= has no value");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu capacity=2GiB\n", 1, "capacity= is given twice");
  ExpectOneError("#DW jobdw type=scratchy capacity=1GiB pool=gpu\n", 1, "unknown type 'scratchy'");
  ExpectOneError("#DW jobdw access_mode=stripy capacity=1GiB pool=gpu\n", 1, "unknown access_mode");
  ExpectOneError("#DW jobdw capacity=1GiB pool=GPU_A\n", 1, "is not a pool name");
  ExpectOneError(
      std::string(kJobDw) + "#DW stage_in type=dir source=/a destination=" + "$DW_JOB_STRIPED/a\n",
      2, "unknown type 'dir'");
}

TEST(SlurmDirectivesTest, BadSizes) {
  for (const char* bad : {"lots", "-1GiB", "10XB", "1.2.3GiB", "GiB"}) {
    ExpectOneError(std::string("#DW jobdw pool=gpu capacity=") + bad + "\n", 1, "is not a size");
  }
  ExpectOneError("#DW jobdw capacity=0 pool=gpu\n", 1, "capacity must be more than 0");
  ExpectOneError("#DW jobdw type=scratch access_mode=striped pool=gpu\n", 1,
                 "capacity= is missing");
}

TEST(SlurmDirectivesTest, StageInRules) {
  const std::string jobdw = kJobDw;
  ExpectOneError(jobdw + "#DW stage_in type=directory destination=$DW_JOB_STRIPED/a\n", 2,
                 "source= is missing");
  ExpectOneError(jobdw + "#DW stage_in source=data/train destination=$DW_JOB_STRIPED/a\n", 2,
                 "'data/train' is not an absolute path");
  ExpectOneError(jobdw + "#DW stage_in source=$HOME/train destination=$DW_JOB_STRIPED/a\n", 2,
                 "is not an absolute path");
  ExpectOneError(jobdw + "#DW stage_in source=/a\n", 2, "destination= is missing");
  ExpectOneError(jobdw + "#DW stage_in source=/a destination=/tmp/a\n", 2,
                 "'/tmp/a' is outside $DW_JOB_STRIPED");
  ExpectOneError(jobdw + "#DW stage_in source=/a destination=$DW_PERSISTENT_STRIPED_x/a\n", 2,
                 "is outside $DW_JOB_STRIPED");
  ExpectOneError(jobdw + "#DW stage_in source=/a destination=$DW_JOB_STRIPED\n", 2,
                 "is not a name under $DW_JOB_STRIPED");
  ExpectOneError(jobdw + "#DW stage_in source=/a destination=$DW_JOB_STRIPEDX/a\n", 2,
                 "is not a name under $DW_JOB_STRIPED");
  for (const char* bad : {"../x", "a/b", "Train", "", "-a", "a_b", "."}) {
    ExpectOneError(jobdw + "#DW stage_in source=/a destination=$DW_JOB_STRIPED/" + bad + "\n", 2,
                   "destination name");
  }
  std::string long_name(slurm::kMaxStageInNameLength + 1, 'a');
  ExpectOneError(jobdw + "#DW stage_in source=/a destination=$DW_JOB_STRIPED/" + long_name + "\n",
                 2, "destination name");
  ExpectOneError(jobdw +
                     "#DW stage_in source=/a destination=$DW_JOB_STRIPED/x\n"
                     "#DW stage_in source=/b destination=$DW_JOB_STRIPED/x\n",
                 3, "is already staged in on line 2");
  ExpectOneError("#SBATCH -N1\n#DW stage_in source=/a destination=$DW_JOB_STRIPED/x\n", 2,
                 "needs a job-scoped instance");
  ExpectOneError(jobdw + jobdw, 2, "a second #DW jobdw (the first is on line 1)");
}

TEST(SlurmDirectivesTest, PersistentDwRules) {
  ExpectOneError("#DW persistentdw\n", 1, "name= is missing");
  ExpectOneError("#DW persistentdw name=ImageNet\n", 1, "is not a dataset name");
  ExpectOneError("#DW persistentdw name=a\n#DW persistentdw name=a\n", 2,
                 "is already named on line 1");
}

TEST(SlurmDirectivesTest, EveryProblemIsReportedInLineOrder) {
  DirectiveParse parse = ParseJobDirectives(
      "#!/bin/bash\n"
      "#DW stage_in source=rel destination=/x\n"
      "#DW swap 1GiB\n"
      "#DW jobdw capacity=big\n");
  std::vector<int> lines;
  for (const slurm::DirectiveError& e : parse.errors) lines.push_back(e.line);
  EXPECT_EQ(lines, (std::vector<int>{2, 2, 3, 4, 4})) << ::testing::PrintToString(Errors(parse));
}

// A #DW line ending in '\' goes on on the next #DW line, as Slurm merges them
// (burst_buffer_lua.c, _xlate_batch): without that line's "#DW", and without
// its leading white space when a space came before the '\'.
TEST(SlurmDirectivesTest, ContinuedLinesAreMergedAsSlurmDoes) {
  DirectiveParse parse = ParseJobDirectives(
      "#!/bin/bash\n"
      "#DW jobdw type=scratch capacity=1GiB \\\n"
      "#DW      access_mode=striped pool=gpu\n"
      "#DW stage_in source=/lustre/a\\\n"
      "\n"
      "#DW destination=$DW_JOB_STRIPED/a\n"
      "#DW stage_in source=/lustre/b destination=$DW_JOB_STRIPED/b\\\n"
      "#DWee\n"
      "#DW persistentdw name=coco\n");
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  const slurm::JobDirectives& d = parse.directives;
  ASSERT_TRUE(d.jobdw.has_value());
  EXPECT_EQ(d.jobdw->line, 2);
  EXPECT_EQ(d.jobdw->pool, "gpu");
  EXPECT_EQ(d.jobdw->capacity_bytes, 1ull << 30);
  ASSERT_EQ(d.stage_ins.size(), 2u);
  EXPECT_EQ(d.stage_ins[0].line, 4);  // no space before '\': the next line's space stays
  EXPECT_EQ(d.stage_ins[0].source, "/lustre/a");
  EXPECT_EQ(d.stage_ins[0].name, "a");
  EXPECT_EQ(d.stage_ins[1].line, 7);  // "#DWee" glued on: the name is "bee"
  EXPECT_EQ(d.stage_ins[1].name, "bee");
  ASSERT_EQ(d.persistent.size(), 1u);
  EXPECT_EQ(d.persistent[0].line, 9);

  // Errors in a continued directive are reported at its first line.
  ExpectOneError("#DW jobdw capacity=1GiB \\\n#DW pool=Bad\n", 1, "is not a pool name");
}

// Slurm stops reading #DW lines at the first line that is neither empty nor a
// comment; one after it would be ignored by Slurm.
TEST(SlurmDirectivesTest, DirectivesAfterTheFirstCommandAreRefused) {
  ExpectOneError(std::string("#!/bin/sh\n\n") + kJobDw + "srun true\n#DW persistentdw name=a\n", 5,
                 "#DW after the script's first command (line 4): Slurm reads #DW lines only "
                 "before it");
  ExpectOneError(std::string(kJobDw) + "  \n#DW persistentdw name=a\n", 3, "(line 2)");
}

TEST(SlurmDirectivesTest, MalformedContinuationsSayWhy) {
  ExpectOneError(std::string(kJobDw) + "#DW persistentdw name=coco \\\n", 2,
                 "line 2 ends in '\\' but no line follows");
  ExpectOneError(std::string(kJobDw) + "#DW persistentdw name=coco \\\n\n\n", 2, "no line follows");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu \\\n#SBATCH -N 1\n", 1,
                 "line 1 ends in '\\' but line 2 does not start with #DW: Slurm ends the "
                 "directive there and drops the '\\'");
  ExpectOneError("#DW jobdw capacity=1GiB \\\nsrun true\n", 1, "line 2 does not start with #DW");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu \\\r\n#DW persistentdw name=a\r\n", 1,
                 "Windows line end: Slurm does not go on");
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu\n#DW persistentdw name=a\\\\b\n", 2,
                 "'\\\\' in a directive is not supported: Slurm stops replacing '%' symbols");
}

// In source=, destination= and persistentdw name=, %% is a '%' and %j the job
// id. Without the id (validate), the values are kept as written and checked
// with a 10-digit stand-in.
TEST(SlurmDirectivesTest, PercentSymbols) {
  const std::string script = std::string(kJobDw) +
                             "#DW stage_in source=/lustre/run-%j/100%% "
                             "destination=$DW_JOB_STRIPED/data-%j\n"
                             "#DW persistentdw name=ckpt-%j\n";
  DirectiveParse parse = ParseJobDirectives(script);
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  ASSERT_EQ(parse.directives.stage_ins.size(), 1u);
  EXPECT_EQ(parse.directives.stage_ins[0].source, "/lustre/run-4294967294/100%");
  EXPECT_EQ(parse.directives.stage_ins[0].source_written, "/lustre/run-%j/100%%");
  EXPECT_EQ(parse.directives.stage_ins[0].name, "data-4294967294");
  EXPECT_EQ(parse.directives.stage_ins[0].name_written, "data-%j");
  EXPECT_TRUE(parse.directives.stage_ins[0].symbolic);
  EXPECT_EQ(parse.directives.persistent[0].name, "ckpt-4294967294");
  EXPECT_EQ(parse.directives.persistent[0].name_written, "ckpt-%j");
  EXPECT_TRUE(parse.directives.persistent[0].symbolic);

  parse = ParseJobDirectives(script, {.job_id = "42"});
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  EXPECT_EQ(parse.directives.stage_ins[0].source, "/lustre/run-42/100%");
  EXPECT_EQ(parse.directives.stage_ins[0].name, "data-42");
  EXPECT_FALSE(parse.directives.stage_ins[0].symbolic);
  EXPECT_TRUE(parse.directives.stage_ins[0].name_written.empty());
  EXPECT_EQ(parse.directives.persistent[0].name, "ckpt-42");

  // Slurm's replaced copy: a '%' is a '%'.
  parse = ParseJobDirectives("#!/bin/sh\n" + std::string(kJobDw) +
                                 "#DW stage_in source=/l/100%j destination=$DW_JOB_STRIPED/d-42\n",
                             {.job_id = "42", .replaced = true});
  ASSERT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
  EXPECT_EQ(parse.directives.stage_ins[0].source, "/l/100%j");
  EXPECT_TRUE(slurm::IsSlurmReplacedScript("/proc/812/fd/14"));
  EXPECT_FALSE(slurm::IsSlurmReplacedScript("/var/spool/slurm/hash.2/job.42/script"));

  // The stand-in is as long as the longest job id.
  ExpectOneError(std::string(kJobDw) + "#DW stage_in source=/a destination=$DW_JOB_STRIPED/" +
                     std::string(37, 'a') + "-%j\n",
                 2, "must be one name");
  ExpectOneError(std::string(kJobDw) + "#DW stage_in source=/a destination=$DW_JOB_STRIPED/a%%b\n",
                 2, "must be one name");
  ExpectOneError(std::string(kJobDw) + "#DW stage_in source=/a/%z destination=$DW_JOB_STRIPED/a\n",
                 2, "'%z' is not a Slurm symbol: Slurm deletes it (both characters)");
  ExpectOneError(std::string(kJobDw) + "#DW stage_in source=/a/% destination=$DW_JOB_STRIPED/a\n",
                 2, "ends in a lone '%'; write %% for a '%'");
  for (const char* symbol : {"%u", "%x", "%d", "%A", "%a"}) {
    ExpectOneError(std::string(kJobDw) + "#DW stage_in source=/a/" + symbol +
                       " destination=$DW_JOB_STRIPED/a\n",
                   2, std::string(symbol) + " (");
  }
  ExpectOneError("#DW jobdw capacity=1GiB pool=gpu-%j\n", 1,
                 "Slurm reads this value as written, before it replaces '%' symbols");
  ExpectOneError("#DW jobdw capacity=%jGiB pool=gpu\n", 1, "Slurm reads this value as written");

  EXPECT_EQ(slurm::ReplaceJobIdSymbols("#!/bin/sh\necho %j\n#DW stage_in source=/a/%j%%j \\\n"
                                       "#DW destination=$DW_JOB_STRIPED/d-%j\n",
                                       "7"),
            "#!/bin/sh\necho %j\n#DW stage_in source=/a/7%%j \\\n"
            "#DW destination=$DW_JOB_STRIPED/d-7\n");
}

// The rules that look at the world, over a real store and real directories.
class SlurmValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_url_ = "sqlite://" + dir_.path() + "/granary.db";
    source_ = dir_.path() + "/train";
    ASSERT_EQ(mkdir(source_.c_str(), 0755), 0);
    testing::WriteAll(source_ + "/a.jpg", "bytes");
    auto store = OpenMetadataStore(store_url_);
    ASSERT_OK(store);
    store_ = std::move(*store);
    ASSERT_OK(store_->Heartbeat(testing::MakeNode("node-1", "gpu"), std::chrono::hours(1)));
    ASSERT_OK(store_->CreateDataset(testing::MakeDataset("coco")));
  }

  DirectiveParse Check(const std::string& script) {
    DirectiveParse parse = ParseJobDirectives(script);
    Status s = slurm::CheckJobDirectives(parse, store_.get());
    EXPECT_OK(s);
    return parse;
  }

  void ExpectOneCheckError(const std::string& script, int line, const std::string& part) {
    DirectiveParse parse = Check(script);
    ASSERT_EQ(parse.errors.size(), 1u) << ::testing::PrintToString(Errors(parse));
    EXPECT_EQ(parse.errors[0].line, line);
    EXPECT_NE(parse.errors[0].reason.find(part), std::string::npos) << parse.errors[0].reason;
  }

  int Run(std::vector<std::string> args, std::string* out, std::string* err) {
    args.insert(args.begin(), {"--store", store_url_});
    std::ostringstream o;
    std::ostringstream e;
    int code = RunCli(args, o, e, false);
    *out = o.str();
    *err = e.str();
    return code;
  }

  // `granary slurm validate` on `script` written to a file.
  int Validate(const std::string& script, std::string* out, std::string* err, bool json = false) {
    std::string path = dir_.Join("job.sh");
    testing::WriteAll(path, script);
    std::vector<std::string> args = {"--store", store_url_, "slurm", "validate", path};
    if (json) args.insert(args.begin(), {"-o", "json"});
    std::ostringstream o;
    std::ostringstream e;
    int code = RunCli(args, o, e, false);
    *out = o.str();
    *err = e.str();
    return code;
  }

  testing::TempDir dir_;
  std::string store_url_;
  std::string source_;
  std::unique_ptr<MetadataStore> store_;
};

TEST_F(SlurmValidateTest, AcceptsAGoodScript) {
  DirectiveParse parse = Check("#DW jobdw capacity=1GiB pool=gpu\n#DW stage_in source=" + source_ +
                               " destination=$DW_JOB_STRIPED/train\n#DW persistentdw name=coco\n");
  EXPECT_TRUE(parse.errors.empty()) << ::testing::PrintToString(Errors(parse));
}

TEST_F(SlurmValidateTest, SourceMustBeAnExistingDirectory) {
  std::string jobdw = kJobDw;
  ExpectOneCheckError(
      jobdw + "#DW stage_in source=" + source_ + "/missing destination=$DW_JOB_STRIPED/x\n", 2,
      "does not exist");
  ExpectOneCheckError(
      jobdw + "#DW stage_in source=" + source_ + "/a.jpg/sub destination=$DW_JOB_STRIPED/x\n", 2,
      "does not exist");
  ExpectOneCheckError(
      jobdw + "#DW stage_in source=" + source_ + "/a.jpg destination=$DW_JOB_STRIPED/x\n", 2,
      "is not a directory");
}

TEST_F(SlurmValidateTest, PoolMustHaveALiveNode) {
  ExpectOneCheckError("#DW jobdw capacity=1GiB pool=cpu\n", 1,
                      "unknown pool 'cpu'; the pools with live cache nodes are gpu");
  EXPECT_TRUE(Check("#DW jobdw capacity=1GiB pool=gpu\n").errors.empty());
}

TEST_F(SlurmValidateTest, PersistentDatasetMustExist) {
  ExpectOneCheckError("#DW persistentdw name=coco\n#DW persistentdw name=imagenet\n", 2,
                      "dataset 'imagenet' does not exist; create it first");
}

// Root, the owner, and the users and groups granted read a persistentdw
// dataset; anyone else is refused with the owner and the fix.
TEST(PersistentDwRefusalTest, OwnerRootAndGrantedReadersOnly) {
  DatasetRecord d = testing::MakeDataset("coco");  // owner uid 1000, gid 100
  auto refusal = [&](uint32_t uid, uint32_t gid, std::vector<uint32_t> groups) {
    return slurm::PersistentDwRefusal(d, slurm::JobUser{uid, gid, std::move(groups), ""});
  };
  EXPECT_EQ(refusal(0, 0, {}), "");
  EXPECT_EQ(refusal(1000, 5, {}), "");
  const std::string nobody = refusal(65534, 65534, {65534});
  EXPECT_NE(nobody.find("uid 65534 may not read dataset 'coco'"), std::string::npos) << nobody;
  EXPECT_NE(nobody.find("belongs to uid 1000, who granted it to no one"), std::string::npos);
  EXPECT_NE(nobody.find("granary dataset grant coco --user 65534"), std::string::npos) << nobody;
  // The owner's group is not a grant by itself.
  EXPECT_NE(refusal(2000, 100, {100}), "");
  const std::string alice =
      slurm::PersistentDwRefusal(d, slurm::JobUser{2000, 100, {100}, "alice"});
  EXPECT_NE(alice.find("alice (uid 2000) may not read"), std::string::npos) << alice;
  EXPECT_NE(alice.find("--user alice`"), std::string::npos) << alice;
  d.readers.uids = {2000, 3000};
  d.readers.gids = {500, 600};
  EXPECT_EQ(refusal(2000, 7, {}), "");
  EXPECT_EQ(refusal(3000, 7, {}), "");
  EXPECT_EQ(refusal(4000, 600, {}), "") << "primary group granted";
  EXPECT_EQ(refusal(4000, 7, {7, 500}), "") << "a supplementary group granted";
  const std::string other = refusal(4000, 7, {7, 8});
  EXPECT_NE(other.find("did not grant it to this user or a group of theirs"), std::string::npos)
      << other;
}

TEST_F(SlurmValidateTest, PersistentDwOfADatasetTheUserMayNotReadIsRefused) {
  // coco is uid 1000's. With the submitting user (Slurm 23.02+ passes it),
  // validate refuses another user's dataset at sbatch.
  const std::string script = "#!/bin/sh\n#DW persistentdw name=coco\n";
  std::string path = dir_.Join("job.sh");
  testing::WriteAll(path, script);
  std::string out;
  std::string err;
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "65534", "--gid", "65534"}, &out, &err),
            kCliUsage);
  EXPECT_NE(err.find("line 2: #DW persistentdw: "), std::string::npos) << err;
  EXPECT_NE(err.find("may not read dataset 'coco'"), std::string::npos) << err;
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "1000", "--gid", "100"}, &out, &err), kCliOk)
      << err;
  EXPECT_EQ(Run({"slurm", "validate", path}, &out, &err), kCliOk) << "22.05: no user to check";
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "65534"}, &out, &err), kCliUsage);
  EXPECT_NE(err.find("give --uid and --gid together"), std::string::npos) << err;
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "x", "--gid", "1"}, &out, &err), kCliUsage);
  EXPECT_NE(err.find("uid 'x' is not a numeric id"), std::string::npos) << err;
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "4294967295", "--gid", "1"}, &out, &err),
            kCliUsage);

  // setup refuses it too (22.05's first step that knows the user): the job
  // is held with the reason; nothing is made for it.
  const std::string job = dir_.Join("job-dw.sh");
  testing::WriteAll(job,
                    "#!/bin/sh\n#DW jobdw capacity=1GiB pool=gpu\n#DW stage_in source=" + source_ +
                        " destination=$DW_JOB_STRIPED/train\n" + "#DW persistentdw name=coco\n");
  EXPECT_EQ(Run({"slurm", "setup", "51", "65534", "65534", job}, &out, &err), kCliFailed);
  EXPECT_NE(err.find("job 51: line 4: #DW persistentdw: "), std::string::npos) << err;
  EXPECT_NE(err.find("granary dataset grant coco --user"), std::string::npos) << err;
  EXPECT_EQ(store_->GetDataset("slurm-51-train").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Run({"slurm", "setup", "51", "nobody", "65534", job}, &out, &err), kCliUsage);

  // Granted (by group), the same steps pass.
  ASSERT_EQ(Run({"dataset", "grant", "coco", "--group", "65534"}, &out, &err), kCliOk) << err;
  EXPECT_EQ(Run({"slurm", "validate", path, "--uid", "65534", "--gid", "65534"}, &out, &err),
            kCliOk)
      << err;
  EXPECT_EQ(Run({"slurm", "setup", "51", "65534", "65534", job}, &out, &err), kCliOk) << err;
  EXPECT_OK(store_->GetDataset("slurm-51-train"));
}

// A Kubernetes Dataset's Kubernetes name is not its Granary name: the error
// names the Granary names that Dataset could have (<namespace>-<name>-<hash>).
TEST_F(SlurmValidateTest, AKubernetesNameGetsTheGranaryNamesToUse) {
  ASSERT_OK(store_->CreateDataset(testing::MakeDataset("team-a-imagenet-6a31ae5737")));
  ASSERT_OK(store_->CreateDataset(testing::MakeDataset("team-b-imagenet-0123456789")));
  ASSERT_OK(store_->CreateDataset(testing::MakeDataset("team-c-imagenet-notahash12")));
  ASSERT_OK(store_->CreateDataset(testing::MakeDataset("team-d-xl-imagenet-00000000aa")));
  ExpectOneCheckError("#DW persistentdw name=imagenet\n", 1,
                      "status.granaryName (kubectl get dataset imagenet -n <namespace> -o "
                      "jsonpath='{.status.granaryName}'); write name=team-a-imagenet-6a31ae5737 "
                      "(or one of team-a-imagenet-6a31ae5737, team-b-imagenet-0123456789, "
                      "team-d-xl-imagenet-00000000aa)");
  ExpectOneCheckError("#DW persistentdw name=xl-imagenet\n", 1,
                      "write name=team-d-xl-imagenet-00000000aa");
}

TEST_F(SlurmValidateTest, CommandPrintsTheDirectivesOrEveryProblem) {
  std::string out;
  std::string err;
  ASSERT_EQ(Validate("#!/bin/bash\n#DW jobdw capacity=1GiB pool=gpu\n#DW stage_in source=" +
                         source_ + " destination=$DW_JOB_STRIPED/train\n",
                     &out, &err),
            kCliOk)
      << err;
  EXPECT_NE(out.find("line 2: jobdw 1.00 GiB in pool gpu"), std::string::npos) << out;
  EXPECT_NE(out.find("line 3: stage_in " + source_ + " -> $DW_JOB_STRIPED/train"),
            std::string::npos)
      << out;

  ASSERT_EQ(Validate("#DW persistentdw name=coco\n", &out, &err, /*json=*/true), kCliOk) << err;
  auto json = nlohmann::json::parse(out);
  EXPECT_TRUE(json["jobdw"].is_null());
  ASSERT_EQ(json["persistentdw"].size(), 1u);
  EXPECT_EQ(json["persistentdw"][0]["name"], "coco");
  EXPECT_EQ(json["persistentdw"][0]["line"], 1);

  ASSERT_EQ(Validate("#!/bin/bash\n#DW jobdw capacity=1GiB pool=cpu\n#DW stage_in source=" +
                         source_ + "/nope destination=/tmp/x\n#DW persistentdw name=nope\n",
                     &out, &err),
            kCliUsage);
  EXPECT_NE(err.find("line 2: #DW jobdw: unknown pool 'cpu'"), std::string::npos) << err;
  EXPECT_NE(err.find("line 3: #DW stage_in: destination '/tmp/x' is outside"), std::string::npos)
      << err;
  EXPECT_NE(err.find("line 4: #DW persistentdw: dataset 'nope' does not exist"), std::string::npos)
      << err;

  std::ostringstream o;
  std::ostringstream e;
  EXPECT_EQ(
      RunCli({"--store", store_url_, "slurm", "validate", dir_.Join("absent.sh")}, o, e, false),
      kCliNotFound);
  EXPECT_NE(e.str().find("reading the job script"), std::string::npos) << e.str();
}

TEST_F(SlurmValidateTest, NoStoreNeededWithoutJobDwOrPersistentDw) {
  std::string path = dir_.Join("job.sh");
  const std::string unreachable = "redis://127.0.0.1:1/0?timeout_ms=200&retry_ms=200";
  // A store URL that cannot be opened is not touched: no directive, or only
  // problems the script shows by itself.
  for (const auto& [script, code] : std::vector<std::pair<std::string, int>>{
           {"#!/bin/sh\necho hi\n", kCliOk}, {"#DW swap 1GiB\n", kCliUsage}}) {
    testing::WriteAll(path, script);
    std::ostringstream o;
    std::ostringstream e;
    EXPECT_EQ(RunCli({"--store", unreachable, "slurm", "validate", path}, o, e, false), code)
        << script << e.str();
  }
  for (const std::string& script :
       std::vector<std::string>{"#DW persistentdw name=coco\n", kJobDw}) {
    testing::WriteAll(path, script);
    std::ostringstream o;
    std::ostringstream e;
    EXPECT_EQ(RunCli({"--store", unreachable, "slurm", "validate", path}, o, e, false),
              kCliUnavailable)
        << script << e.str();
  }
}

TEST_F(SlurmValidateTest, PoolsSumsTheLiveNodesOfEachPool) {
  std::string out;
  std::string err;
  ASSERT_EQ(Run({"slurm", "pools"}, &out, &err), kCliOk) << err;
  const uint64_t node_bytes = testing::MakeNode("x").capacity_bytes;
  EXPECT_EQ(nlohmann::json::parse(out),
            nlohmann::json::parse(R"({"pools":[{"id":"gpu","quantity":)" +
                                  std::to_string(node_bytes) + R"(,"granularity":1}]})"));
  ASSERT_OK(store_->Heartbeat(testing::MakeNode("node-2", "gpu"), std::chrono::hours(1)));
  ASSERT_OK(store_->Heartbeat(testing::MakeNode("node-3", "cpu"), std::chrono::hours(1)));
  ASSERT_EQ(Run({"slurm", "pools"}, &out, &err), kCliOk) << err;
  auto pools = nlohmann::json::parse(out)["pools"];
  ASSERT_EQ(pools.size(), 2u) << out;
  EXPECT_EQ(pools[0]["id"], "cpu");
  EXPECT_EQ(pools[0]["quantity"], node_bytes);
  EXPECT_EQ(pools[1]["id"], "gpu");
  EXPECT_EQ(pools[1]["quantity"], 2 * node_bytes);
}

// setup, data_in, paths and teardown of one job, as Slurm calls them.
TEST_F(SlurmValidateTest, JobLifecycle) {
  const std::string script = dir_.Join("job.sh");
  testing::WriteAll(script,
                    "#!/bin/bash\n#DW jobdw capacity=1GiB pool=gpu\n"
                    "#DW stage_in type=directory source=" +
                        source_ +
                        " destination=$DW_JOB_STRIPED/train\n#DW persistentdw name=coco\n");
  const std::string uid = std::to_string(getuid());
  const std::string gid = std::to_string(getgid());
  std::string out;
  std::string err;
  ASSERT_EQ(Run({"slurm", "setup", "42", uid, gid, script}, &out, &err), kCliOk) << err;
  auto created = store_->GetDataset("slurm-42-train");
  ASSERT_OK(created);
  EXPECT_EQ(created->spec.source_uri, "file://" + source_);
  EXPECT_EQ(created->spec.pool, "gpu");
  EXPECT_EQ(created->owner.uid, getuid());
  EXPECT_TRUE(created->manifest_id.empty());
  // Slurm may call setup again.
  ASSERT_EQ(Run({"slurm", "setup", "42", uid, gid, script}, &out, &err), kCliOk) << err;

  // The persistent dataset has no snapshot yet: data_in waits for it, then
  // gives up with the reason.
  EXPECT_EQ(Run({"slurm", "data_in", "42", script, "--timeout", "300ms"}, &out, &err), kCliTimeout);
  EXPECT_NE(err.find("waiting for dataset coco"), std::string::npos) << err;
  auto staged = store_->GetDataset("slurm-42-train");
  ASSERT_OK(staged);
  EXPECT_FALSE(staged->manifest_id.empty());
  EXPECT_EQ(staged->state.phase, DatasetPhase::kStaging);

  auto coco = store_->GetDataset("coco");
  ASSERT_OK(coco);
  coco->state.phase = DatasetPhase::kStaging;
  ASSERT_OK(store_->UpdateDataset(*coco));
  ASSERT_EQ(Run({"slurm", "data_in", "42", script, "--timeout", "10s"}, &out, &err), kCliOk) << err;

  const std::string path_file = dir_.Join("paths");
  testing::WriteAll(path_file, "");
  ASSERT_EQ(Run({"slurm", "paths", "42", script, path_file, "--job-root", "/run/g"}, &out, &err),
            kCliOk)
      << err;
  EXPECT_EQ(testing::ReadAll(path_file),
            "DW_JOB_STRIPED=/run/g/job-42\nGRANARY_SOCKET=/run/g/job-42.sock\n"
            "GRANARY_DATASET=slurm-42-train\nGRANARY_STORE=" +
                store_url_ + "\n");
  EXPECT_EQ(Run({"slurm", "paths", "42", script, dir_.Join("none/paths")}, &out, &err),
            kCliNotFound);
  EXPECT_NE(err.find("opening Slurm's path file"), std::string::npos) << err;

  // Another job's dataset whose name starts alike is not touched.
  DatasetRecord other = testing::MakeDataset("slurm-420-train");
  ASSERT_OK(store_->CreateDataset(other));
  ASSERT_EQ(Run({"slurm", "teardown", "42"}, &out, &err), kCliOk) << err;
  EXPECT_NE(out.find("1 job-scoped datasets deleted"), std::string::npos) << out;
  EXPECT_EQ(store_->GetDataset("slurm-42-train").status().code(), StatusCode::kNotFound);
  EXPECT_OK(store_->GetDataset("coco"));
  EXPECT_OK(store_->GetDataset("slurm-420-train"));
  ASSERT_EQ(Run({"slurm", "teardown", "42"}, &out, &err), kCliOk) << err;
  EXPECT_NE(out.find("0 job-scoped datasets deleted"), std::string::npos) << out;
}

TEST_F(SlurmValidateTest, StepsRefuseBadJobIdsAndScripts) {
  const std::string script = dir_.Join("job.sh");
  testing::WriteAll(script, "#DW jobdw capacity=1GiB pool=gpu\n#DW stage_in source=/x\n");
  std::string out;
  std::string err;
  EXPECT_EQ(Run({"slurm", "teardown", "4x"}, &out, &err), kCliUsage);
  EXPECT_NE(err.find("Slurm job id '4x'"), std::string::npos) << err;
  EXPECT_EQ(Run({"slurm", "setup", "12345678901", "0", "0", script}, &out, &err), kCliUsage);
  EXPECT_EQ(Run({"slurm", "setup", "7", "0", "0", script}, &out, &err), kCliUsage);
  EXPECT_NE(err.find("job 7: #DW directives not valid: line 2"), std::string::npos) << err;
  EXPECT_EQ(Run({"slurm", "data_in", "7", dir_.Join("gone.sh")}, &out, &err), kCliNotFound);
  EXPECT_NE(err.find("job 7: reading the job script"), std::string::npos) << err;
}

// A %j job as Slurm runs it: validate and paths get the script as submitted,
// setup and data_in Slurm's replaced copy (/proc/<pid>/fd/<n>; here this
// process's own descriptor), with the continued jobdw merged.
TEST_F(SlurmValidateTest, PercentJAndContinuedLinesThroughTheSteps) {
  const std::string source = dir_.Join("run-42");
  ASSERT_EQ(mkdir(source.c_str(), 0755), 0);
  testing::WriteAll(source + "/a.jpg", "bytes");
  const std::string script = dir_.Join("job.sh");
  testing::WriteAll(script,
                    "#!/bin/bash\n#DW jobdw capacity=1GiB \\\n#DW pool=gpu\n"
                    "#DW stage_in source=" +
                        dir_.path() + "/run-%j destination=$DW_JOB_STRIPED/data-%j\nsrun true\n");
  const std::string copy = dir_.Join("copy");
  testing::WriteAll(copy,
                    "#!/bin/sh\n#!/bin/bash\n#DW jobdw capacity=1GiB pool=gpu\n"
                    "#DW stage_in source=" +
                        source + " destination=$DW_JOB_STRIPED/data-42\n");
  int fd = open(copy.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::string proc_copy = "/proc/self/fd/" + std::to_string(fd);
  std::string out;
  std::string err;
  ASSERT_EQ(Run({"slurm", "validate", script}, &out, &err), kCliOk) << err;
  EXPECT_NE(out.find("line 2: jobdw 1.00 GiB in pool gpu"), std::string::npos) << out;
  EXPECT_NE(out.find("line 4: stage_in " + dir_.path() + "/run-%j -> $DW_JOB_STRIPED/data-%j"),
            std::string::npos)
      << out;
  ASSERT_EQ(Run({"-o", "json", "slurm", "validate", script}, &out, &err), kCliOk) << err;
  nlohmann::json shown = nlohmann::json::parse(out);
  EXPECT_EQ(shown["stage_in"][0]["name"], "data-%j") << out;
  EXPECT_EQ(shown["stage_in"][0]["source"], dir_.path() + "/run-%j") << out;
  const std::string uid = std::to_string(getuid());
  const std::string gid = std::to_string(getgid());
  ASSERT_EQ(Run({"slurm", "setup", "42", uid, gid, proc_copy}, &out, &err), kCliOk) << err;
  auto created = store_->GetDataset("slurm-42-data-42");
  ASSERT_OK(created);
  EXPECT_EQ(created->spec.source_uri, "file://" + source);
  // Without the copy (no memfd), the submitted script says the same.
  ASSERT_EQ(Run({"slurm", "setup", "42", uid, gid, script}, &out, &err), kCliOk) << err;
  ASSERT_EQ(Run({"slurm", "data_in", "42", proc_copy, "--timeout", "10s"}, &out, &err), kCliOk)
      << err;
  close(fd);
  const std::string path_file = dir_.Join("paths");
  testing::WriteAll(path_file, "");
  ASSERT_EQ(Run({"slurm", "paths", "42", script, path_file, "--job-root", "/run/g"}, &out, &err),
            kCliOk)
      << err;
  EXPECT_NE(testing::ReadAll(path_file).find("GRANARY_DATASET=slurm-42-data-42\n"),
            std::string::npos);
  ASSERT_EQ(Run({"slurm", "teardown", "42"}, &out, &err), kCliOk) << err;
}

}  // namespace
}  // namespace granary
