// CSV as RFC 4180 and Python's csv module write it: comma-separated fields, a field in double quotes may hold commas,
// line breaks and doubled quotes (""), rows end at LF or CRLF. A leading UTF-8 byte-order mark is skipped.
#pragma once
#include <string>
#include <vector>

namespace sd::io {

struct CsvRow {
  int line = 0;  // where the row starts, from 1
  std::vector<std::string> fields;
};

// Every non-empty row of `text`. Throws sd::Error naming `name` and the line for an unterminated quoted field or
// text after a closing quote.
std::vector<CsvRow> parse_csv(const std::string& text, const std::string& name);

}  // namespace sd::io
