// dcr/detail/protocol/store/s3_xml.hpp: the few elements dcr reads from S3's XML responses (ListObjectsV2,
// ListMultipartUploads, multipart initiate and complete, errors), implementation only.
//
// Not a general XML parser: S3 answers small, flat documents of known shape. This reads the
// text of named elements (attributes ignored, self-closing elements empty, comments and the
// XML declaration skipped) and decodes the five predefined entities, numeric character
// references (&#34; &#x22;) and CDATA sections. Anything it cannot read as such throws
// std::invalid_argument, which the S3 store reports as an unreadable response.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dcr::detail::s3 {

/// The position just past the opening tag `<name ...>` found at or after `from` in `xml`
/// (with `self_closing` set for `<name/>`), or npos. A tag is `name` only when the name is
/// followed by '>', '/' or white space (so "Key" never matches "<KeyCount>").
inline std::size_t find_open_tag(std::string_view xml, std::string_view name, std::size_t from,
                                 bool& self_closing) {
  for (std::size_t at = xml.find('<', from); at != std::string_view::npos; at = xml.find('<', at + 1)) {
    if (xml.compare(at + 1, name.size(), name) != 0) continue;
    const std::size_t after = at + 1 + name.size();
    if (after >= xml.size()) return std::string_view::npos;
    const char c = xml[after];
    if (c != '>' && c != '/' && c != ' ' && c != '\t' && c != '\r' && c != '\n') continue;
    const std::size_t close = xml.find('>', after);
    if (close == std::string_view::npos) throw std::invalid_argument("unterminated <" + std::string(name) + "> tag");
    self_closing = xml[close - 1] == '/';
    return close + 1;
  }
  return std::string_view::npos;
}

/// The raw (undecoded) contents of every element named `name` in `xml`, in document order.
/// Elements of one name must not nest (true of every S3 element dcr reads).
inline std::vector<std::string_view> elements(std::string_view xml, std::string_view name) {
  std::vector<std::string_view> out;
  const std::string close = "</" + std::string(name) + ">";
  std::size_t at = 0;
  for (;;) {
    bool self_closing = false;
    const std::size_t begin = find_open_tag(xml, name, at, self_closing);
    if (begin == std::string_view::npos) return out;
    if (self_closing) {
      out.emplace_back();
      at = begin;
      continue;
    }
    const std::size_t end = xml.find(close, begin);
    if (end == std::string_view::npos) throw std::invalid_argument("<" + std::string(name) + "> is not closed");
    out.push_back(xml.substr(begin, end - begin));
    at = end + close.size();
  }
}

/// Appends code point `cp` as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    throw std::invalid_argument("character reference to an invalid code point");
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// Character data with its entities and character references decoded and CDATA sections
/// unwrapped. A markup character left in it ('<' that does not open CDATA) throws: the text
/// holds a child element, which callers never expect.
inline std::string decode_text(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size();) {
    const char c = raw[i];
    if (c == '<') {
      if (raw.compare(i, 9, "<![CDATA[") != 0) throw std::invalid_argument("markup inside a text element");
      const std::size_t end = raw.find("]]>", i + 9);
      if (end == std::string_view::npos) throw std::invalid_argument("unterminated CDATA section");
      out.append(raw.substr(i + 9, end - i - 9));
      i = end + 3;
      continue;
    }
    if (c != '&') {
      out += c;
      ++i;
      continue;
    }
    const std::size_t semi = raw.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) throw std::invalid_argument("unterminated entity");
    const std::string_view entity = raw.substr(i + 1, semi - i - 1);
    if (entity == "lt") out += '<';
    else if (entity == "gt") out += '>';
    else if (entity == "amp") out += '&';
    else if (entity == "quot") out += '"';
    else if (entity == "apos") out += '\'';
    else if (entity.size() >= 2 && entity[0] == '#') {
      const bool hex = entity[1] == 'x' || entity[1] == 'X';
      const std::string_view digits = entity.substr(hex ? 2 : 1);
      if (digits.empty()) throw std::invalid_argument("empty character reference");
      std::uint32_t cp = 0;
      for (const char d : digits) {
        std::uint32_t v = 0;
        if (d >= '0' && d <= '9') v = static_cast<std::uint32_t>(d - '0');
        else if (hex && d >= 'a' && d <= 'f') v = static_cast<std::uint32_t>(d - 'a' + 10);
        else if (hex && d >= 'A' && d <= 'F') v = static_cast<std::uint32_t>(d - 'A' + 10);
        else throw std::invalid_argument("bad character reference '&" + std::string(entity) + ";'");
        cp = cp * (hex ? 16 : 10) + v;
        if (cp > 0x10FFFF) throw std::invalid_argument("character reference out of range");
      }
      append_utf8(out, cp);
    } else {
      throw std::invalid_argument("unknown entity '&" + std::string(entity) + ";'");
    }
    i = semi + 1;
  }
  return out;
}

/// The decoded text of the first element `name` in `xml`, or nullopt if there is none.
inline std::optional<std::string> first_text(std::string_view xml, std::string_view name) {
  bool self_closing = false;
  const std::size_t begin = find_open_tag(xml, name, 0, self_closing);
  if (begin == std::string_view::npos) return std::nullopt;
  if (self_closing) return std::string();
  const std::string close = "</" + std::string(name) + ">";
  const std::size_t end = xml.find(close, begin);
  if (end == std::string_view::npos) throw std::invalid_argument("<" + std::string(name) + "> is not closed");
  return decode_text(xml.substr(begin, end - begin));
}

/// The name of the document's root element ("" if none): "Error" for an S3 error body.
inline std::string root_name(std::string_view xml) {
  std::size_t at = 0;
  for (;;) {
    at = xml.find('<', at);
    if (at == std::string_view::npos || at + 1 >= xml.size()) return {};
    if (xml[at + 1] == '?') {  // the declaration
      at = xml.find("?>", at);
      if (at == std::string_view::npos) return {};
      continue;
    }
    if (xml.compare(at, 4, "<!--") == 0) {
      at = xml.find("-->", at);
      if (at == std::string_view::npos) return {};
      continue;
    }
    const std::size_t end = xml.find_first_of(" \t\r\n/>", at + 1);
    return std::string(xml.substr(at + 1, end == std::string_view::npos ? std::string_view::npos : end - at - 1));
  }
}

/// `text` with the five XML special characters escaped (for request bodies).
inline std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace dcr::detail::s3
