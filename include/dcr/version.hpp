// dcr/version.hpp: the library's version, for code that must check which dcr it compiles
// against (`#if DCR_VERSION >= 200` for "0.2.0 or later").
//
// The numbers follow the Meson project version (meson.build's `project(version : ...)`); the
// test `version_matches_project` fails when the two disagree, so bump both in one commit
// (CHANGELOG.md lists what each release changed). Releases before 1.0.0 may break the API in
// any minor version; a patch release never does.
#pragma once

#define DCR_VERSION_MAJOR 0
#define DCR_VERSION_MINOR 2
#define DCR_VERSION_PATCH 0

/// "MAJOR.MINOR.PATCH", the same text as meson.project_version() and the pkg-config Version.
#define DCR_VERSION_STRING "0.2.0"

/// One number that orders versions: MAJOR * 10000 + MINOR * 100 + PATCH (0.2.0 is 200).
#define DCR_VERSION (DCR_VERSION_MAJOR * 10000 + DCR_VERSION_MINOR * 100 + DCR_VERSION_PATCH)

namespace dcr {
/// The version as constants, for code that prefers them to macros.
inline constexpr int version_major = DCR_VERSION_MAJOR;
inline constexpr int version_minor = DCR_VERSION_MINOR;
inline constexpr int version_patch = DCR_VERSION_PATCH;
inline constexpr const char* version_string = DCR_VERSION_STRING;
}  // namespace dcr
