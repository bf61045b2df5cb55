#include "io/json_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sd::io {
namespace {

using nlohmann::json;

std::string error_reading_int64(const json& value) {
  return sd::test::error_of([&] { JsonConfig(json{{"n", value}}, "c.json").require<int64_t>("n"); });
}

std::string error_reading_int(const json& value) {
  return sd::test::error_of([&] { JsonConfig(json{{"n", value}}, "c.json").require<int>("n"); });
}

TEST(JsonConfig, IntegersWrittenAsWholeFloatsAreIntegers) {
  const JsonConfig config(json{{"a", 4.0}, {"b", -3}, {"c", 9007199254740992.0}}, "c.json");
  EXPECT_EQ(config.require<int64_t>("a"), 4);
  EXPECT_EQ(config.require<int>("b"), -3);
  EXPECT_EQ(config.require<int64_t>("c"), int64_t(1) << 53);
}

TEST(JsonConfig, NumbersOutsideTheTargetTypeAreRefusedNotWrapped) {
  EXPECT_EQ(error_reading_int64(2.5), "c.json: key 'n' must be an integer, got 2.5");
  // The fuzzer's case: a float far outside int64 used to be cast (undefined behaviour) instead of refused.
  EXPECT_EQ(error_reading_int64(1e300), "c.json: key 'n' must be an integer, got 1e+300");
  EXPECT_EQ(error_reading_int64(-1e19), "c.json: key 'n' must be an integer, got -1e+19");
  EXPECT_EQ(error_reading_int64(9223372036854775808.0),
            "c.json: key 'n' must be an integer, got 9.223372036854776e+18");
  EXPECT_EQ(error_reading_int64(json(uint64_t(18446744073709551615u))),
            "c.json: key 'n' must be an integer that fits in 64 bits, got 18446744073709551615");
  EXPECT_EQ(error_reading_int(4294967297), "c.json: key 'n' must be an integer that fits in 32 bits, got 4294967297");
  EXPECT_EQ(error_reading_int(-2147483649.0),
            "c.json: key 'n' must be an integer that fits in 32 bits, got -2147483649.0");
  EXPECT_EQ(JsonConfig(json{{"n", -2147483648}}, "c.json").require<int>("n"), -2147483648);
}

}  // namespace
}  // namespace sd::io
