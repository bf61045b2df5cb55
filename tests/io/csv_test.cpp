// CSV as Python's csv module writes it (Hugging Face imagefolder's metadata.csv).
#include "io/csv.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace sd::io {
namespace {

using Fields = std::vector<std::string>;

TEST(Csv, QuotedFieldsHoldCommasQuotesAndLineBreaks) {
  const std::string text =
      "\xEF\xBB\xBF"
      "file_name,text\r\n"
      "a.png,\"a cat, sitting\"\r\n"
      "\n"
      "b.png,\"she said \"\"hi\"\"\nand left\"\n"
      "c.png,\n"
      "d.png,last";
  const std::vector<CsvRow> rows = parse_csv(text, "m.csv");
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].fields, (Fields{"file_name", "text"}));
  EXPECT_EQ(rows[1].fields, (Fields{"a.png", "a cat, sitting"}));
  EXPECT_EQ(rows[2].fields, (Fields{"b.png", "she said \"hi\"\nand left"}));
  EXPECT_EQ(rows[2].line, 4);
  EXPECT_EQ(rows[3].fields, (Fields{"c.png", ""}));
  EXPECT_EQ(rows[3].line, 6);
  EXPECT_EQ(rows[4].fields, (Fields{"d.png", "last"}));
}

TEST(Csv, BadQuotingNamesTheFileAndLine) {
  EXPECT_EQ(sd::test::error_of([] { parse_csv("a,b\nx,\"open\n", "m.csv"); }),
            "m.csv line 2: a quoted field is never closed");
  EXPECT_EQ(sd::test::error_of([] { parse_csv("a,b\n\"x\"y,z\n", "m.csv"); }),
            "m.csv line 2: text after a closing quote (a quote inside a quoted field is written \"\")");
}

}  // namespace
}  // namespace sd::io
