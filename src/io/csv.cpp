#include "io/csv.h"

#include "core/error.h"

namespace sd::io {

std::vector<CsvRow> parse_csv(const std::string& text, const std::string& name) {
  std::vector<CsvRow> rows;
  size_t i = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  int line = 1;
  while (i < text.size()) {
    CsvRow row{line, {}};
    std::string field;
    bool row_ended = false;
    while (!row_ended) {
      if (i < text.size() && text[i] == '"') {  // quoted: up to the closing quote, "" standing for one
        const int opened_at = line;
        for (++i;; ++i) {
          SD_CHECK(i < text.size(), "{} line {}: a quoted field is never closed", name, opened_at);
          if (text[i] == '"' && i + 1 < text.size() && text[i + 1] == '"') {
            field += '"';
            ++i;
          } else if (text[i] == '"') {
            ++i;
            break;
          } else {
            if (text[i] == '\n') ++line;
            field += text[i];
          }
        }
        SD_CHECK(i >= text.size() || text[i] == ',' || text[i] == '\n' || text[i] == '\r',
                 "{} line {}: text after "
                 "a closing quote (a quote inside a quoted field is written \"\")",
                 name, line);
      } else {
        while (i < text.size() && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && text[i + 1] == '\n'))
          field += text[i++];
      }
      row.fields.push_back(std::move(field));
      field.clear();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == '\r') ++i;
      if (i < text.size()) ++i, ++line;  // the '\n'
      row_ended = true;
    }
    if (!(row.fields.size() == 1 && row.fields[0].empty())) rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace sd::io
