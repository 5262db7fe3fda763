#include "tensor/io/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tg {
namespace io {
namespace {

namespace fs = std::filesystem;

// ---- helpers ---------------------------------------------------------------------------------

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file: length + header text (unpadded, as given) + data bytes.
std::string MakeFile(const std::string& header, const std::string& data) {
  return U64(header.size()) + header + data;
}

std::string BytesOf(const RawTensor& t) {
  const RawTensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), c.numel() * c.element_size());
}

void ExpectSameTensor(const RawTensor& expected, const RawTensor& actual, const std::string& name) {
  ASSERT_TRUE(actual.defined()) << name;
  EXPECT_EQ(actual.dtype(), expected.dtype()) << name;
  EXPECT_EQ(ShapeToString(actual.shape()), ShapeToString(expected.shape())) << name;
  EXPECT_TRUE(actual.is_contiguous()) << name;
  EXPECT_TRUE(actual.device().is_cpu()) << name;
  EXPECT_EQ(BytesOf(actual), BytesOf(expected)) << name << " differs bitwise";
}

// The status has `code` and exactly `message`.
::testing::AssertionResult IsError(const absl::Status& status, absl::StatusCode code,
                                   const std::string& message) {
  if (status.code() != code || status.message() != message) {
    return ::testing::AssertionFailure() << "got " << status << "\n   expected "
                                         << absl::StatusCodeToString(code) << ": " << message;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult HasError(const absl::Status& status, absl::StatusCode code,
                                    const std::string& substring) {
  if (status.ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  if (status.code() != code || status.message().find(substring) == absl::string_view::npos) {
    return ::testing::AssertionFailure()
           << "got " << status << "; expected code " << absl::StatusCodeToString(code) << " with \""
           << substring << "\"";
  }
  return ::testing::AssertionSuccess();
}

uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// A fresh, empty directory per test.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       absl::StrCat("safetensors_", info->test_suite_name(), "_", info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// Names of the entries of `dir` that look like our temporary files.
std::vector<std::string> TempFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp") != std::string::npos) out.push_back(name);
  }
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One tensor of every dtype, with edge values, plus 0-d, empty and strided inputs.
Safetensors EveryKind() {
  Safetensors st;
  std::vector<Half> halves;
  std::vector<BFloat16> bhalves;
  for (uint32_t b = 0; b < 65536; ++b) {  // every 16-bit pattern, NaN payloads included
    halves.push_back(Half::FromBits(static_cast<uint16_t>(b)));
    bhalves.push_back(BFloat16::FromBits(static_cast<uint16_t>(b)));
  }
  st.tensors["f16.all"] = RawTensor::FromVector<Half>(halves, {256, 256});
  st.tensors["bf16.all"] = RawTensor::FromVector<BFloat16>(bhalves, {65536});
  st.tensors["f32"] = RawTensor::FromVector<float>(
      {0.1f, -0.0f, std::numeric_limits<float>::infinity(), BitsToFloat(0x7fa00001u),
       BitsToFloat(0xffc12345u), std::numeric_limits<float>::denorm_min(), 3.0f},
      {7});
  st.tensors["f64"] = RawTensor::FromVector<double>(
      {0.1, -0.0, 1e300, std::numeric_limits<double>::denorm_min(), -1.0 / 3.0, 4.0}, {3, 2});
  st.tensors["i32"] = RawTensor::FromVector<int32_t>(
      {std::numeric_limits<int32_t>::min(), -1, 0, 1, std::numeric_limits<int32_t>::max()}, {5});
  st.tensors["i64"] = RawTensor::FromVector<int64_t>(
      {std::numeric_limits<int64_t>::min(), -1, std::numeric_limits<int64_t>::max()}, {1, 3});
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<uint8_t>(i));
  st.tensors["u8"] = RawTensor::FromVector<uint8_t>(bytes, {2, 2, 64});
  st.tensors["bool"] = RawTensor::FromVector<bool>({true, false, false, true, true}, {5});
  // Every FP8 code of both formats, NaN codes included (FP8 -> FP8 copies keep the bytes).
  std::vector<uint8_t> codes;
  for (int i = 0; i < 256; ++i) codes.push_back(static_cast<uint8_t>(i));
  for (DType fp8 : {kF8E4M3, kF8E5M2}) {
    RawTensor t = RawTensor::Empty({16, 16}, fp8);
    std::memcpy(t.raw_data(), codes.data(), codes.size());
    st.tensors[DTypeName(fp8)] = t;
  }
  st.tensors["scalar.f64"] = RawTensor::Scalar(-2.5, kF64);
  st.tensors["scalar.bool"] = RawTensor::Scalar(1, kBool);
  st.tensors["empty.f32"] = RawTensor::Empty({0, 3}, kF32);
  st.tensors["empty.bf16"] = RawTensor::Empty({4, 0}, kBF16);
  st.tensors["empty.1d.i64"] = RawTensor::Empty({0}, kI64);
  const RawTensor x = RawTensor::Arange(0, 24, 1, kF32).view({2, 3, 4});
  st.tensors["transposed"] = x.transpose(0, 2);             // [4, 3, 2], strided
  st.tensors["sliced"] = x.slice(2, 1, 4, 2).select(0, 1);  // offset + strides
  st.tensors["expanded"] = RawTensor::FromVector<int32_t>({7, 8}, {2, 1}).expand({2, 3});
  return st;
}

void ExpectSameSafetensors(const Safetensors& expected, const Safetensors& actual) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (const auto& [name, t] : expected.tensors) {
    auto it = actual.tensors.find(name);
    ASSERT_NE(it, actual.tensors.end()) << name;
    ExpectSameTensor(t, it->second, name);
  }
  EXPECT_EQ(actual.metadata, expected.metadata);
}

// ---- the format's published example --------------------------------------------------------

TEST(SafetensorsTest, PublishedExampleLoads) {
  const std::string header = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_EQ(header.size(), 0x3cu);  // the example's length byte is '<'
  const std::string bytes = std::string("<\0\0\0\0\0\0\0", 8) + header + std::string(16, '\0');
  absl::StatusOr<Safetensors> st = ParseSafetensors(bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors.size(), 1u);
  EXPECT_TRUE(st->metadata.empty());
  const RawTensor& t = st->tensors.at("test");
  EXPECT_EQ(t.dtype(), kI32);
  EXPECT_EQ(ShapeToString(t.shape()), "[2, 2]");
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0, 0}));
}

// ---- round trips -----------------------------------------------------------------------------

TEST(SafetensorsTest, RoundTripEveryDtypeBitExact) {
  Safetensors st = EveryKind();
  st.metadata["format"] = "pt";
  st.metadata["quote\" backslash\\ newline\n tab\t"] = "ünïcødé ✓ \x01";
  st.metadata[std::string("nul\0inside", 10)] = "";
  absl::StatusOr<std::string> bytes = SerializeSafetensors(st);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Safetensors> back = ParseSafetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameSafetensors(st, *back);
  // The strided inputs come back as their contiguous values.
  EXPECT_EQ(back->tensors.at("transposed").to_vector<float>()[1], 12.0f);
  EXPECT_EQ(back->tensors.at("sliced").to_vector<float>(),
            (std::vector<float>{13, 15, 17, 19, 21, 23}));
  EXPECT_EQ(back->tensors.at("expanded").to_vector<int32_t>(),
            (std::vector<int32_t>{7, 7, 7, 8, 8, 8}));
  // Serialising the result again gives the same bytes (the writer is deterministic).
  absl::StatusOr<std::string> again = SerializeSafetensors(*back);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *bytes);
}

TEST(SafetensorsTest, RoundTripThroughFile) {
  const std::string path = TestDir() + "/every.safetensors";
  Safetensors st = EveryKind();
  st.metadata["step"] = "12";
  ASSERT_TRUE(SaveSafetensors(path, st).ok());
  absl::StatusOr<Safetensors> back = LoadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameSafetensors(st, *back);
  EXPECT_EQ(ReadFile(path), *SerializeSafetensors(st));
}

TEST(SafetensorsTest, EmptyFileRoundTrips) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(Safetensors{});
  ASSERT_TRUE(bytes.ok());
  absl::StatusOr<Safetensors> back = ParseSafetensors(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tensors.empty());
  EXPECT_TRUE(back->metadata.empty());
}

// ---- the writer's bytes ----------------------------------------------------------------------

// The reference library's own test vectors (safetensors/src/tensor.rs): an empty file is the
// same bytes; otherwise our writer only adds checksums to __metadata__, one per tensor and one of
// the whole header (the CRC-32 values come from Python's zlib.crc32, the header's of the JSON
// text without its own entry), so Python's safetensors reads what we write.
TEST(SafetensorsTest, WriterMatchesReferenceBytes) {
  Safetensors empty;
  EXPECT_EQ(*SerializeSafetensors(empty), U64(8) + "{}      ");

  Safetensors meta;
  meta.metadata["framework"] = "pt";
  EXPECT_EQ(
      *SerializeSafetensors(meta),
      U64(72) + R"({"__metadata__":{"crc32:__metadata__":"c82dc889","framework":"pt"}})" + "     ");

  const RawTensor values = RawTensor::FromVector<float>({0, 1, 2, 3, 4, 5}, {6});
  Safetensors one;
  one.tensors["attn.0"] = values.view({1, 2, 3});
  EXPECT_EQ(*SerializeSafetensors(one),
            U64(144) +
                R"({"__metadata__":{"crc32:__metadata__":"b0267dbb","crc32:attn.0":"91e79017"},)"
                R"("attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" +
                "     " + BytesOf(values));

  Safetensors padded;  // 147 bytes of JSON: padded with 5 spaces to 152
  padded.tensors["attn0"] = values.view({1, 1, 2, 3});
  padded.metadata["a"] = "b";
  EXPECT_EQ(*SerializeSafetensors(padded),
            U64(152) +
                R"({"__metadata__":{"a":"b","crc32:__metadata__":"873bcf73",)"
                R"("crc32:attn0":"91e79017"},)"
                R"("attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                "     " + BytesOf(values));
}

// Mixed dtypes: the header is 8-byte aligned, offsets run contiguously from 0 to the end of the
// file with no gap, larger dtypes come first (then names), so each tensor is aligned to its
// element size in the file.
TEST(SafetensorsTest, WriterLayoutIsContiguousAndAligned) {
  Safetensors st;
  st.tensors["b"] = RawTensor::Ones({3}, kBool);
  st.tensors["u"] = RawTensor::Ones({5}, kU8);
  st.tensors["h"] = RawTensor::Ones({3}, kF16);
  st.tensors["bh"] = RawTensor::Ones({1}, kBF16);
  st.tensors["f"] = RawTensor::Ones({3}, kF32);
  st.tensors["i"] = RawTensor::Ones({1}, kI32);
  st.tensors["d"] = RawTensor::Ones({1}, kF64);
  st.tensors["l"] = RawTensor::Ones({2}, kI64);
  st.tensors["a_scalar"] = RawTensor::Scalar(2, kF64);
  st.tensors["z_empty"] = RawTensor::Empty({0}, kF64);
  st.metadata["k"] = "v";
  const std::string bytes = *SerializeSafetensors(st);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, bytes.size());
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);
  // Entries in file order: by descending reference dtype rank, then name.
  const std::vector<std::string> order = {"l", "a_scalar", "d", "z_empty", "f",
                                          "i", "bh",       "h", "u",       "b"};
  size_t last = 0;
  for (const std::string& name : order) {
    const size_t at = header.find("\"" + name + "\":");
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_GT(at, last) << name << " is out of order";
    last = at;
  }
  EXPECT_EQ(header.find(R"({"__metadata__":{"crc32:__metadata__":")"), 0u);
  EXPECT_NE(header.find(R"(","crc32:a_scalar":")"), std::string::npos);
  EXPECT_NE(header.find(R"(,"k":"v"},)"), std::string::npos);

  const nlohmann::json j = nlohmann::json::parse(header);
  uint64_t expected_begin = 0;
  for (const std::string& name : order) {
    const auto& entry = j.at(name);
    const uint64_t begin = entry.at("data_offsets")[0], end = entry.at("data_offsets")[1];
    EXPECT_EQ(begin, expected_begin) << name;
    EXPECT_EQ(begin % st.tensors.at(name).element_size(), 0u) << name;
    expected_begin = end;
  }
  EXPECT_EQ(8 + n + expected_begin, bytes.size()) << "the data buffer ends with the last tensor";
}

TEST(SafetensorsTest, WriterRejectsWhatItCannotStore) {
  Safetensors undefined;
  undefined.tensors["w"] = RawTensor();
  EXPECT_TRUE(HasError(SerializeSafetensors(undefined).status(), absl::StatusCode::kInvalidArgument,
                       "SerializeSafetensors: tensor 'w' is undefined"));
  Safetensors reserved;
  reserved.tensors["__metadata__"] = RawTensor::Zeros({1});
  EXPECT_TRUE(HasError(SerializeSafetensors(reserved).status(), absl::StatusCode::kInvalidArgument,
                       "tensor '__metadata__': the name is reserved for the metadata object"));
  Safetensors bad_name;
  bad_name.tensors["w\xff"] = RawTensor::Zeros({1});
  EXPECT_TRUE(HasError(SerializeSafetensors(bad_name).status(), absl::StatusCode::kInvalidArgument,
                       "the name is not valid UTF-8"));
  Safetensors bad_meta;
  bad_meta.metadata["k"] = "\xc0\x80";  // overlong NUL
  EXPECT_TRUE(HasError(SerializeSafetensors(bad_meta).status(), absl::StatusCode::kInvalidArgument,
                       "metadata entry 'k' is not valid UTF-8"));
  bad_meta.metadata["k"] = "\xed\xa0\x80";  // a UTF-16 surrogate
  EXPECT_FALSE(SerializeSafetensors(bad_meta).ok());
  bad_meta.metadata["k"] = "\xf0\x9f\x98";  // cut short
  EXPECT_FALSE(SerializeSafetensors(bad_meta).ok());
  bad_meta.metadata["k"] = "\xf0\x9f\x98\x80";  // complete: fine
  EXPECT_TRUE(SerializeSafetensors(bad_meta).ok());

  const std::string dir = TestDir();
  EXPECT_FALSE(SaveSafetensors(dir + "/x.safetensors", undefined).ok());
  EXPECT_TRUE(fs::is_empty(dir));
}

// ---- StateDict -------------------------------------------------------------------------------

TEST(SafetensorsTest, StateDictRoundTripIsBitExact) {
  const std::string path = TestDir() + "/sd.safetensors";
  StateDict sd;
  const std::vector<double> values = {0.1,
                                      1e300,
                                      -0.0,
                                      0.0,
                                      9007199254740992.0,  // 2^53
                                      9007199254740994.0,
                                      1.0 / 3.0,
                                      -2.718281828459045,
                                      std::numeric_limits<double>::denorm_min(),
                                      -std::numeric_limits<double>::denorm_min() * 12345,
                                      std::numeric_limits<double>::min(),
                                      std::numeric_limits<double>::max(),
                                      -std::numeric_limits<double>::max(),
                                      std::numeric_limits<double>::infinity(),
                                      -std::numeric_limits<double>::infinity(),
                                      65536.0,
                                      static_cast<double>(1.0f / 3.0f)};
  for (size_t i = 0; i < values.size(); ++i) sd.scalars[absl::StrCat("s.", i)] = values[i];
  sd.scalars["nan"] = std::numeric_limits<double>::quiet_NaN();
  sd.scalars["neg_nan"] = -std::numeric_limits<double>::quiet_NaN();
  sd.tensors["state.0.exp_avg"] = RawTensor::FromVector<float>({0.5f, -1e-30f}, {2});
  sd.tensors["w16"] = RawTensor::FromVector<float>({1.5f, 65504.0f}, {2}, kF16);
  ASSERT_TRUE(SaveStateDict(path, sd, {{"format", "tapegrad"}}).ok());

  std::map<std::string, std::string> metadata;
  absl::StatusOr<StateDict> back = LoadStateDict(path, &metadata);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "tapegrad"}}));
  ASSERT_EQ(back->scalars.size(), sd.scalars.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string key = absl::StrCat("s.", i);
    EXPECT_EQ(DoubleBits(back->scalar(key)), DoubleBits(values[i])) << key << " = " << values[i];
  }
  EXPECT_TRUE(std::isnan(back->scalar("nan")));
  EXPECT_FALSE(std::signbit(back->scalar("nan")));
  EXPECT_TRUE(std::isnan(back->scalar("neg_nan")));
  EXPECT_TRUE(std::signbit(back->scalar("neg_nan")));
  ASSERT_EQ(back->tensors.size(), 2u);
  for (const auto& [name, t] : sd.tensors) ExpectSameTensor(t, back->tensor(name), name);

  // The scalars are readable text in __metadata__.
  absl::StatusOr<Safetensors> raw = LoadSafetensors(path);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->metadata.at("scalar:s.0"), "0.10000000000000001");
  EXPECT_EQ(raw->metadata.at("scalar:s.2"), "-0");
  EXPECT_EQ(raw->metadata.at("scalar:s.4"), "9007199254740992");
  EXPECT_EQ(raw->metadata.at("format"), "tapegrad");
  // Without an out-parameter the other metadata is dropped.
  EXPECT_TRUE(LoadStateDict(path).ok());
}

TEST(SafetensorsTest, StateDictErrors) {
  const std::string dir = TestDir();
  EXPECT_TRUE(
      HasError(SaveStateDict(dir + "/a.safetensors", StateDict{}, {{"scalar:x", "1"}}),
               absl::StatusCode::kInvalidArgument,
               "SaveStateDict: metadata key 'scalar:x' uses the reserved prefix 'scalar:'"));
  EXPECT_TRUE(fs::is_empty(dir));

  Safetensors st;
  st.metadata["scalar:lr"] = "fast";
  ASSERT_TRUE(SaveSafetensors(dir + "/b.safetensors", st).ok());
  EXPECT_TRUE(HasError(LoadStateDict(dir + "/b.safetensors").status(),
                       absl::StatusCode::kInvalidArgument,
                       "safetensors file '" + dir +
                           "/b.safetensors': scalar 'scalar:lr' has the value 'fast'; expected a "
                           "number"));
  EXPECT_TRUE(HasError(LoadStateDict(dir + "/missing.safetensors").status(),
                       absl::StatusCode::kNotFound, "missing.safetensors"));
}

// ---- corrupt input ---------------------------------------------------------------------------

struct CorruptCase {
  const char* what;
  std::string bytes;
  absl::StatusCode code;
  std::string message;  // a substring of the error
};

TEST(SafetensorsTest, CorruptInputGivesClearErrors) {
  using C = absl::StatusCode;
  const std::string ok_header = R"({"x":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string ok_file = MakeFile(ok_header, std::string(16, '\1'));
  auto entry = [](const std::string& body) {
    return MakeFile("{\"x\":" + body + "}", "") + std::string(64, '\0');
  };
  const std::vector<CorruptCase> cases = {
      {"shorter than the length field", "abc", C::kDataLoss,
       "safetensors buffer: 3 bytes is too short for the 8-byte header length"},
      {"cut in the header", ok_file.substr(0, 30), C::kDataLoss,
       "safetensors buffer: header length 57 exceeds the 22 bytes that follow the length field"},
      {"cut in the data", ok_file.substr(0, ok_file.size() - 3), C::kDataLoss,
       "safetensors buffer: tensor 'x': data_offsets [0, 16] end beyond the data buffer of 13 "
       "bytes"},
      {"header length 0", U64(0) + "{}", C::kInvalidArgument,
       "safetensors buffer: header length is 0"},
      {"huge header length", U64(uint64_t{1} << 62) + "{}", C::kInvalidArgument,
       "header length 4611686018427387904 exceeds the limit of 100000000 bytes"},
      {"all-ones header length", U64(~uint64_t{0}) + "{}", C::kInvalidArgument,
       "header length 18446744073709551615 exceeds the limit"},
      {"bad JSON", MakeFile(R"({"x":)", ""), C::kInvalidArgument,
       "safetensors buffer: header is not valid JSON: [json.exception.parse_error.101]"},
      {"trailing garbage after the object", MakeFile("{} x", ""), C::kInvalidArgument,
       "header is not valid JSON"},
      {"invalid UTF-8 in a name", MakeFile("{\"\xff\":1}", ""), C::kInvalidArgument,
       "header is not valid JSON"},
      {"header not an object", MakeFile("[1,2]", ""), C::kInvalidArgument,
       "safetensors buffer: header must be a JSON object, found array [1,2]"},
      {"deep nesting",
       MakeFile("{\"a\":" + std::string(1000, '[') + std::string(1000, ']') + "}", ""),
       C::kInvalidArgument, "header JSON nests deeper than 16 levels"},
      {"entry not an object", entry("3"), C::kInvalidArgument,
       "safetensors buffer: tensor 'x': expected an object with dtype, shape and data_offsets, "
       "found number 3"},
      {"missing dtype", entry(R"({"shape":[],"data_offsets":[0,4]})"), C::kInvalidArgument,
       "tensor 'x': missing \"dtype\""},
      {"missing shape", entry(R"({"dtype":"F32","data_offsets":[0,4]})"), C::kInvalidArgument,
       "tensor 'x': missing \"shape\""},
      {"missing data_offsets", entry(R"({"dtype":"F32","shape":[]})"), C::kInvalidArgument,
       "tensor 'x': missing \"data_offsets\""},
      {"dtype not a string", entry(R"({"dtype":32,"shape":[],"data_offsets":[0,4]})"),
       C::kInvalidArgument, "tensor 'x': \"dtype\" must be a string, found number 32"},
      {"wrong dtype name", entry(R"({"dtype":"F33","shape":[],"data_offsets":[0,4]})"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'x': unsupported dtype 'F33' (expected one of F32, F64, F16, "
       "BF16, I32, I64, U8, BOOL, F8_E4M3, F8_E5M2)"},
      {"lowercase dtype name", entry(R"({"dtype":"f32","shape":[],"data_offsets":[0,4]})"),
       C::kInvalidArgument, "unsupported dtype 'f32'"},
      {"shape not an array", entry(R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})"),
       C::kInvalidArgument,
       "tensor 'x': \"shape\" must be an array of non-negative integers, found number 4"},
      {"negative dim", entry(R"({"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]})"),
       C::kInvalidArgument, "tensor 'x': shape[1] must be a non-negative integer, found number -2"},
      {"fractional dim", entry(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,10]})"),
       C::kInvalidArgument, "shape[0] must be a non-negative integer, found number 2.5"},
      {"string dim", entry(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})"),
       C::kInvalidArgument, "shape[0] must be a non-negative integer, found string \"2\""},
      {"numel overflow",
       entry(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})"),
       C::kInvalidArgument,
       "tensor 'x': shape [4294967296,4294967296] has more elements than int64 can count"},
      {"strides overflow behind a zero",
       entry(R"({"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]})"),
       C::kInvalidArgument, "has more elements than int64 can count"},
      {"dim beyond int64",
       entry(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]})"),
       C::kInvalidArgument, "has more elements than int64 can count"},
      {"byte size overflow",
       entry(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]})"),
       C::kInvalidArgument, "shape [4611686018427387904] of F64 needs more than 2^64 bytes"},
      {"data_offsets of one number", entry(R"({"dtype":"F32","shape":[],"data_offsets":[0]})"),
       C::kInvalidArgument,
       "tensor 'x': \"data_offsets\" must be two non-negative integers [begin, end], found array "
       "[0]"},
      {"negative data_offsets", entry(R"({"dtype":"F32","shape":[],"data_offsets":[-4,0]})"),
       C::kInvalidArgument, "found array [-4,0]"},
      {"data_offsets begin after end", entry(R"({"dtype":"F32","shape":[],"data_offsets":[8,4]})"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'x': data_offsets [8, 4] begin after end; begin <= end "
       "(safetensors rule)"},
      {"offsets out of range", entry(R"({"dtype":"U8","shape":[68],"data_offsets":[0,68]})"),
       C::kDataLoss,
       "safetensors buffer: tensor 'x': data_offsets [0, 68] end beyond the data buffer of 64 "
       "bytes (truncated file?)"},
      {"huge offsets",
       entry(
           R"({"dtype":"F32","shape":[],"data_offsets":[18446744073709551612,18446744073709551615]})"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'x': data_offsets [18446744073709551612, 18446744073709551615] "
       "leave a gap of 18446744073709551612 bytes at the start of the data buffer; the first "
       "tensor must begin at offset 0 (safetensors rule)"},
      {"huge end", entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]})"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'x': data_offsets [0, 18446744073709551615] hold "
       "18446744073709551615 bytes, but shape [1] of U8 needs 1 (safetensors rule)"},
      {"size mismatch", entry(R"({"dtype":"I32","shape":[2,2],"data_offsets":[0,12]})"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'x': data_offsets [0, 12] hold 12 bytes, but shape [2, 2] of "
       "I32 needs 16"},
      {"overlapping offsets",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                std::string(12, '\0')),
       C::kInvalidArgument,
       "safetensors buffer: tensors 'a' (data_offsets [0, 8]) and 'b' (data_offsets [4, 12]) "
       "overlap; each tensor must begin where the previous one ends (safetensors rule)"},
      {"range inside another",
       MakeFile(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                R"("c":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
                std::string(16, '\0')),
       C::kInvalidArgument, "tensors 'a' (data_offsets [0, 16]) and 'b' (data_offsets [4, 6])"},
      {"metadata not an object", MakeFile(R"({"__metadata__":["a"]})", ""), C::kInvalidArgument,
       "safetensors buffer: \"__metadata__\" must be an object of strings, found array [\"a\"]"},
      {"metadata non-string", MakeFile(R"({"__metadata__":{"k":1}})", ""), C::kInvalidArgument,
       "safetensors buffer: \"__metadata__\" entry 'k' must be a string, found number 1"},
      {"bool byte other than 0/1",
       MakeFile(R"({"x":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})",
                std::string("\1\2\0", 3)),
       C::kInvalidArgument, "safetensors buffer: tensor 'x': BOOL element 1 is 2; expected 0 or 1"},
  };
  for (const CorruptCase& c : cases) {
    absl::StatusOr<Safetensors> st;
    ASSERT_NO_THROW(st = ParseSafetensors(c.bytes)) << c.what;
    EXPECT_TRUE(HasError(st.status(), c.code, c.message)) << c.what;
  }
}

TEST(SafetensorsTest, ReaderAcceptsWhatTheFormatAllows) {
  // Any order of entries, zero-size tensors at the start, between two tensors and at the end
  // (several at one offset), unknown fields (holding duplicate keys: ignored, as the reference
  // does), a null __metadata__ and JSON whitespace of every kind around the object.
  const std::string data = std::string("\1\0\0\0", 4) + std::string("\2\0\0\0", 4);
  const std::string header =
      " \t\r\n"
      R"({"__metadata__":null,"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},)"
      R"("e":{"dtype":"F64","shape":[0,5],"data_offsets":[4,4],"extra":{"x":[1],"x":2}},)"
      R"("f":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},)"
      R"("g":{"dtype":"BOOL","shape":[3,0],"data_offsets":[8,8]},)"
      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
      R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})"
      "\n\r\t ";
  absl::StatusOr<Safetensors> st = ParseSafetensors(MakeFile(header, data));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors.size(), 6u);
  EXPECT_EQ(st->tensors.at("a").item(), 1);
  EXPECT_EQ(st->tensors.at("a").dim(), 0);
  EXPECT_EQ(st->tensors.at("b").to_vector<int32_t>(), (std::vector<int32_t>{2}));
  EXPECT_EQ(ShapeToString(st->tensors.at("e").shape()), "[0, 5]");
  EXPECT_EQ(ShapeToString(st->tensors.at("g").shape()), "[3, 0]");
  EXPECT_TRUE(st->metadata.empty());

  // A header of only "{}", with or without padding, and no data.
  for (const std::string& empty : {std::string("{}"), std::string("{}      ")}) {
    absl::StatusOr<Safetensors> e = ParseSafetensors(MakeFile(empty, ""));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(e->tensors.empty());
    EXPECT_TRUE(e->metadata.empty());
  }
}

// Every prefix of a valid file, and random byte changes in its length field and header: each
// parse returns a Status or succeeds, never crashes or throws (run under --config=asan too).
TEST(SafetensorsTest, TruncationAndHeaderCorruptionNeverCrash) {
  Safetensors st;
  st.tensors["w"] = RawTensor::Arange(0, 6, 1, kF32).view({2, 3});
  st.tensors["b"] = RawTensor::FromVector<bool>({true, false}, {2});
  st.tensors["h"] = RawTensor::Ones({3}, kBF16);
  st.tensors["s"] = RawTensor::Scalar(7, kI64);
  st.tensors["e"] = RawTensor::Empty({0, 2}, kF16);
  st.metadata["k"] = "v";
  const std::string bytes = *SerializeSafetensors(st);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);

  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::StatusOr<Safetensors> r;
    ASSERT_NO_THROW(r = ParseSafetensors(absl::string_view(bytes.data(), len)));
    EXPECT_FALSE(r.ok()) << "a " << len << "-byte prefix of " << bytes.size() << " parsed";
  }
  ASSERT_TRUE(ParseSafetensors(bytes).ok());

  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> position(0, 8 + n - 1);
  const std::string interesting = "{}[]\",:-0123456789eE.\\ \xff\x80tfn";
  int parsed = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string mutated = bytes;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const size_t at = position(rng);
      mutated[at] =
          (rng() % 2) ? static_cast<char>(rng() & 0xff) : interesting[rng() % interesting.size()];
    }
    absl::StatusOr<Safetensors> r;
    ASSERT_NO_THROW(r = ParseSafetensors(mutated)) << iter;
    if (r.ok()) {
      ++parsed;
      for (const auto& [name, t] : r->tensors) EXPECT_TRUE(t.is_contiguous());
    } else {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
  EXPECT_LT(parsed, 20000);

  // Mutations that keep the JSON valid, so that they reach the checks of shapes, dtypes and
  // offsets: digits changed or inserted, dtype names swapped (the length field is rewritten).
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
  const std::vector<std::string> dtypes = {"F32", "F64", "F16",  "BF16", "I32",
                                           "I64", "U8",  "BOOL", "I8",   "F8_E4M3"};
  int semantic_ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string h = header;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % h.size();
      const size_t digit = h.find_first_of("0123456789", at);
      switch (rng() % 4) {
        case 0:
        case 1:
          if (digit != std::string::npos) h[digit] = static_cast<char>('0' + rng() % 10);
          break;
        case 2:
          if (digit != std::string::npos) h.insert(digit, 1, static_cast<char>('0' + rng() % 10));
          break;
        case 3: {
          const size_t quote = h.find("\"dtype\":\"", at);
          if (quote == std::string::npos) break;
          const size_t begin = quote + 9, end = h.find('"', begin);
          h.replace(begin, end - begin, dtypes[rng() % dtypes.size()]);
          break;
        }
      }
    }
    absl::StatusOr<Safetensors> r;
    ASSERT_NO_THROW(r = ParseSafetensors(MakeFile(h, data))) << h;
    if (r.ok()) ++semantic_ok;
  }
  EXPECT_GT(semantic_ok, 0);
  EXPECT_LT(semantic_ok, 20000);
}

// ---- the reference library's rules -----------------------------------------------------------

// Written by Python's safetensors 0.8.0 (safetensors.numpy.save, no checksums):
//   save({"w": float32 [[1.5, -2], [0.25, 3]], "b": bool [1, 0, 1], "e": float64 zeros (0, 2),
//         "s": int64 -7, "h": float16 [1, 2, 3], "i": int32 [5, -6], "u": uint8 [200]},
//        metadata={"format": "np", "note": "\u00fc"})
std::string ReferenceWrittenFile() {
  return U64(432) +
         R"({"__metadata__":{"format":"np","note":")"
         "\xc3\xbc"
         R"("},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
         R"("e":{"dtype":"F64","shape":[0,2],"data_offsets":[8,8]},)"
         R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]},)"
         R"("i":{"dtype":"I32","shape":[2],"data_offsets":[24,32]},)"
         R"("h":{"dtype":"F16","shape":[3],"data_offsets":[32,38]},)"
         R"("u":{"dtype":"U8","shape":[1],"data_offsets":[38,39]},)"
         R"("b":{"dtype":"BOOL","shape":[3],"data_offsets":[39,42]}})"
         "     " +
         std::string(
             "\xf9\xff\xff\xff\xff\xff\xff\xff\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x00\x80"
             "\x3e\x00\x00\x40\x40\x05\x00\x00\x00\xfa\xff\xff\xff\x00\x3c\x00\x40\x00\x42"
             "\xc8\x01\x00\x01",
             42);
}

TEST(SafetensorsTest, ReferenceWrittenFileLoads) {
  const std::string bytes = ReferenceWrittenFile();
  ASSERT_EQ(bytes.size(), 482u);
  absl::StatusOr<Safetensors> st = ParseSafetensors(bytes);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->metadata,
            (std::map<std::string, std::string>{{"format", "np"}, {"note", "\xc3\xbc"}}));
  ASSERT_EQ(st->tensors.size(), 7u);
  EXPECT_EQ(st->tensors.at("w").to_vector<float>(), (std::vector<float>{1.5f, -2, 0.25f, 3}));
  EXPECT_EQ(st->tensors.at("b").to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(ShapeToString(st->tensors.at("e").shape()), "[0, 2]");
  EXPECT_EQ(st->tensors.at("s").to_vector<int64_t>(), (std::vector<int64_t>{-7}));
  EXPECT_EQ(st->tensors.at("s").dim(), 0);
  EXPECT_EQ(st->tensors.at("h").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(st->tensors.at("i").to_vector<int32_t>(), (std::vector<int32_t>{5, -6}));
  EXPECT_EQ(st->tensors.at("u").to_vector<uint8_t>(), (std::vector<uint8_t>{200}));
  // Saved again, it differs only by the checksums in __metadata__ (same layout and data).
  const std::string again = *SerializeSafetensors(*st);
  EXPECT_EQ(again.substr(again.size() - 42), bytes.substr(bytes.size() - 42));
  EXPECT_NE(again.find(R"("note":")"
                       "\xc3\xbc"
                       R"("},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("e":{"dtype":"F64","shape":[0,2],"data_offsets":[8,8]},)"),
            std::string::npos);
}

// FP8 tensors as Python's safetensors 0.8.0 writes them (torch 2.15: save({"a": e4m3fn [1.5,
// -448, 0.013671875, nan], "b": e5m2 [[57344, -0.0], [2^-16, 3]], "w": f32 [2]})), byte for byte;
// and our writer puts them where the reference does (F8_E4M3 before F8_E5M2, after F32).
TEST(SafetensorsTest, ReferenceWrittenFp8FileLoadsAndWritesInTheSameOrder) {
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[4,8]},)"
      R"("b":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[8,12]}}     )";
  const std::string data("\x00\x00\x00\x40\x3c\xfe\x07\x7f\x7b\x80\x01\x42", 12);
  absl::StatusOr<Safetensors> st = ParseSafetensors(U64(header.size()) + header + data);
  ASSERT_TRUE(st.ok()) << st.status();
  const RawTensor& a = st->tensors.at("a");
  const RawTensor& b = st->tensors.at("b");
  EXPECT_EQ(a.dtype(), kF8E4M3);
  EXPECT_EQ(b.dtype(), kF8E5M2);
  const std::vector<float> av = a.to_vector<float>();
  EXPECT_EQ(av[0], 1.5f);
  EXPECT_EQ(av[1], -448.0f);
  EXPECT_EQ(av[2], 0.013671875f);
  EXPECT_TRUE(std::isnan(av[3]));
  EXPECT_EQ(ShapeToString(b.shape()), "[2, 2]");
  const std::vector<float> bv = b.to_vector<float>();
  EXPECT_EQ(bv, (std::vector<float>{57344.0f, -0.0f, std::ldexp(1.0f, -16), 3.0f}));
  EXPECT_TRUE(std::signbit(bv[1]));
  const std::string again = *SerializeSafetensors(*st);
  EXPECT_NE(again.find(R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[4,8]},)"
                       R"("b":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[8,12]}})"),
            std::string::npos);
  EXPECT_EQ(again.substr(again.size() - 12), data);
}

// Each rule of huggingface/safetensors (read_metadata, validate) that the reader applies, on a
// file the reference rejects too (checked with Python's safetensors 0.8.0), with the message.
TEST(SafetensorsTest, ReaderAppliesTheReferenceRules) {
  using C = absl::StatusCode;
  const std::string u8x2 = R"({"dtype":"U8","shape":[2],"data_offsets":)";
  // 54 bytes, the last a space (the writer's padding).
  const std::string padded = R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} )";
  struct Case {
    const char* what;
    std::string bytes;
    C code;
    std::string message;  // exact
  };
  const std::vector<Case> cases = {
      // The data buffer appears to start one byte early: every tensor would shift by one byte.
      {"header length one byte short", U64(padded.size() - 1) + padded + "ab", C::kInvalidArgument,
       "safetensors buffer: the data buffer holds 3 bytes after the header, but the tensors "
       "cover 2 (up to the end of tensor 'w'): 1 left over (trailing bytes, or a header length "
       "that is too small); the file must end where the last tensor ends (safetensors rule)"},
      {"trailing bytes", MakeFile("{\"a\":" + u8x2 + "[0,2]}}", "abc"), C::kInvalidArgument,
       "safetensors buffer: the data buffer holds 3 bytes after the header, but the tensors "
       "cover 2 (up to the end of tensor 'a'): 1 left over (trailing bytes, or a header length "
       "that is too small); the file must end where the last tensor ends (safetensors rule)"},
      {"data without tensors", MakeFile("{}", "abcd"), C::kInvalidArgument,
       "safetensors buffer: the data buffer holds 4 bytes after the header, but the header lists "
       "no tensor: 4 left over (trailing bytes, or a header length that is too small); the file "
       "must end where the last tensor ends (safetensors rule)"},
      {"gap after a zero-size tensor",
       MakeFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":)" + u8x2 + "[4,6]}}",
                "abcdef"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'b': data_offsets [4, 6] leave a gap of 4 bytes after tensor "
       "'a' (which ends at 0); the data buffer must be covered exactly, without gaps "
       "(safetensors rule)"},
      {"gap between tensors",
       MakeFile("{\"a\":" + u8x2 + "[0,2]},\"b\":" + u8x2 + "[3,5]}}", "abcde"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'b': data_offsets [3, 5] leave a gap of 1 bytes after tensor "
       "'a' (which ends at 2); the data buffer must be covered exactly, without gaps "
       "(safetensors rule)"},
      {"first tensor not at 0", MakeFile("{\"a\":" + u8x2 + "[2,4]}}", "abcd"), C::kInvalidArgument,
       "safetensors buffer: tensor 'a': data_offsets [2, 4] leave a gap of 2 bytes at the start "
       "of the data buffer; the first tensor must begin at offset 0 (safetensors rule)"},
      {"zero-size tensor inside another",
       MakeFile("{\"a\":" + u8x2 +
                    "[0,2]},\"z\":" + R"({"dtype":"U8","shape":[0],"data_offsets":[1,1]}})",
                "ab"),
       C::kInvalidArgument,
       "safetensors buffer: tensors 'a' (data_offsets [0, 2]) and 'z' (data_offsets [1, 1]) "
       "overlap; each tensor must begin where the previous one ends (safetensors rule)"},
      {"NUL padding", MakeFile("{\"a\":" + u8x2 + "[0,2]}}" + std::string(3, '\0'), "ab"),
       C::kInvalidArgument,
       "safetensors buffer: header byte 53 (of 56) is NUL; the header must be JSON text with "
       "only whitespace around it: pad it with spaces, not NUL bytes (safetensors rule)"},
      {"NUL then text", MakeFile(std::string("{}\0{\"a\":1}", 10), ""), C::kInvalidArgument,
       "safetensors buffer: header byte 2 (of 10) is NUL; the header must be JSON text with "
       "only whitespace around it: pad it with spaces, not NUL bytes (safetensors rule)"},
      // The reference rejects it (invalid offset); the DOM would keep the last and read "ab".
      {"duplicated tensor name",
       MakeFile("{\"a\":" + u8x2 + "[0,2]},\"a\":" + u8x2 + "[2,4]}}", "abcd"), C::kInvalidArgument,
       "safetensors buffer: the header names tensor 'a' twice; each key of an object must be "
       "unique"},
      // The reference accepts this one, silently dropping the first 'a'.
      {"duplicated tensor name, the last at 0",
       MakeFile("{\"a\":" + u8x2 + "[2,4]},\"a\":" + u8x2 + "[0,2]}}", "ab"), C::kInvalidArgument,
       "safetensors buffer: the header names tensor 'a' twice; each key of an object must be "
       "unique"},
      {"duplicated __metadata__",
       MakeFile(R"({"__metadata__":{"k":"1"},"__metadata__":{"k":"2"}})", ""), C::kInvalidArgument,
       "safetensors buffer: the header holds \"__metadata__\" twice; each key of an object must "
       "be unique"},
      {"duplicated __metadata__, escaped",
       MakeFile(R"({"__metadata__":{"k":"1"},"\u005f_metadata__":{"k":"2"}})", ""),
       C::kInvalidArgument,
       "safetensors buffer: the header holds \"__metadata__\" twice; each key of an object must "
       "be unique"},
      {"duplicated field in an entry",
       MakeFile(R"({"a":{"dtype":"U8","shape":[2],"dtype":"U8","data_offsets":[0,2]}})", "ab"),
       C::kInvalidArgument,
       "safetensors buffer: tensor 'a': field \"dtype\" appears twice; each key of an object must "
       "be unique"},
      {"duplicated key in __metadata__",
       MakeFile(R"({"__metadata__":{"k":"1","j":"0","k":"2"}})", ""), C::kInvalidArgument,
       "safetensors buffer: \"__metadata__\" holds the key 'k' twice; each key of an object must "
       "be unique"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Safetensors> st;
    ASSERT_NO_THROW(st = ParseSafetensors(c.bytes)) << c.what;
    EXPECT_TRUE(IsError(st.status(), c.code, c.message)) << c.what;
  }
}

// A header naming 100k tensors (a large checkpoint's count, as a sharded LLM's) parses, also as
// the writer lays it out (a checksum per tensor in __metadata__), and the duplicate-key refusals
// still name the key. Linear time is what lets it run here: the duplicate check used to be
// nlohmann's parser callback, quadratic in the tensor count (4.6x the time per doubling; 0.67 s
// of CPU for 10k tensors on the development VM, over a minute for these); now the parse is one
// SAX pass (docs/reliability.md).
std::string ManyTensorsHeader(int n, const std::string& last_entry) {
  std::string header = "{";
  for (int i = 0; i < n - 1; ++i) {
    absl::StrAppend(&header, "\"t", i, R"(":{"dtype":"U8","shape":[1],"data_offsets":[)", i, ",",
                    i + 1, "]},");
  }
  return header + last_entry + "}";
}

TEST(SafetensorsTest, HeaderWithManyTensorsParses) {
  constexpr int kTensors = 100'000;
  std::string data(kTensors, '\0');
  for (int i = 0; i < kTensors; ++i) data[i] = static_cast<char>(i % 251);
  const std::string last =
      absl::StrCat("\"t", kTensors - 1, R"(":{"dtype":"U8","shape":[1],"data_offsets":[)",
                   kTensors - 1, ",", kTensors, "]}");
  absl::StatusOr<Safetensors> st =
      ParseSafetensors(MakeFile(ManyTensorsHeader(kTensors, last), data));
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors.size(), static_cast<size_t>(kTensors));
  for (int i : {0, 1, 4'999, 50'000, kTensors - 1}) {
    const RawTensor& t = st->tensors.at(absl::StrCat("t", i));
    ASSERT_EQ(t.shape(), (Shape{1})) << i;
    EXPECT_EQ(static_cast<const uint8_t*>(t.raw_data())[0], i % 251) << i;
  }

  // The last entry repeats a name from the middle, or repeats a field.
  const std::string repeated_name = absl::StrCat(
      R"("t50000":{"dtype":"U8","shape":[1],"data_offsets":[)", kTensors - 1, ",", kTensors, "]}");
  EXPECT_TRUE(IsError(
      ParseSafetensors(MakeFile(ManyTensorsHeader(kTensors, repeated_name), data)).status(),
      absl::StatusCode::kInvalidArgument,
      "safetensors buffer: the header names tensor 't50000' twice; each key of an object must be "
      "unique"));
  const std::string repeated_field =
      absl::StrCat("\"t", kTensors - 1, R"(":{"dtype":"U8","shape":[1],"shape":[1],)",
                   R"("data_offsets":[)", kTensors - 1, ",", kTensors, "]}");
  EXPECT_TRUE(IsError(
      ParseSafetensors(MakeFile(ManyTensorsHeader(kTensors, repeated_field), data)).status(),
      absl::StatusCode::kInvalidArgument,
      "safetensors buffer: tensor 't99999': field \"shape\" appears twice; each key of an object "
      "must be unique"));

  // 100k __metadata__ entries, the last repeating one.
  std::string metadata = R"({"__metadata__":{)";
  for (int i = 0; i < kTensors; ++i) absl::StrAppend(&metadata, "\"k", i, "\":\"v\",");
  EXPECT_TRUE(IsError(ParseSafetensors(MakeFile(metadata + R"("k7":"w"}})", "")).status(),
                      absl::StatusCode::kInvalidArgument,
                      "safetensors buffer: \"__metadata__\" holds the key 'k7' twice; each key of "
                      "an object must be unique"));

  // The writer's layout: sorted names, 100k checksum entries in __metadata__ (verified on read).
  absl::StatusOr<std::string> written = SerializeSafetensors(*st);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<Safetensors> back = ParseSafetensors(*written);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_TRUE(back->metadata.empty());  // the checksums are consumed, not shown
  for (int i : {0, 77'777, kTensors - 1}) {
    const RawTensor& t = back->tensors.at(absl::StrCat("t", i));
    EXPECT_EQ(static_cast<const uint8_t*>(t.raw_data())[0], i % 251) << i;
  }
}

// A valid file made invalid by editing its length field by one: never loads shifted data.
TEST(SafetensorsTest, HeaderLengthOffByOneIsRefused) {
  Safetensors st;
  st.tensors["w"] = RawTensor::FromVector<float>({1, 2, 3, 4}, {4});
  const std::string bytes = *SerializeSafetensors(st);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(bytes[8 + n - 1], ' ') << "the test needs a padded header";
  for (const uint64_t wrong : {n - 1, n + 1}) {
    const std::string shifted = U64(wrong) + bytes.substr(8);
    EXPECT_FALSE(ParseSafetensors(shifted).ok()) << "header length " << wrong;
  }
  EXPECT_TRUE(ParseSafetensors(bytes).ok());
}

// ---- checksums ----------------------------------------------------------------------------------

TEST(SafetensorsTest, ChecksumsAreWrittenVerifiedAndHidden) {
  Safetensors st;
  st.tensors["w"] = RawTensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  st.tensors["empty"] = RawTensor::Empty({0}, kF64);
  st.metadata["format"] = "pt";
  const std::string bytes = *SerializeSafetensors(st);
  // Python: "%08x" % zlib.crc32(numpy.array([1, 2, 3, 4], "float32").tobytes())
  EXPECT_NE(bytes.find(R"("crc32:empty":"00000000","crc32:w":"8ba71454",)"
                       R"("format":"pt"},)"),
            std::string::npos);
  absl::StatusOr<Safetensors> back = ParseSafetensors(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameSafetensors(st, *back);  // the metadata without the checksums
  EXPECT_EQ(*SerializeSafetensors(*back), bytes);

  const std::string path = TestDir() + "/w.safetensors";
  ASSERT_TRUE(SaveSafetensors(path, st).ok());
  absl::StatusOr<Safetensors> loaded = LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->metadata, st.metadata);
  ASSERT_TRUE(SaveSafetensors(path, *loaded).ok());
  EXPECT_EQ(ReadFile(path), bytes);
}

TEST(SafetensorsTest, FlippedDataBitIsRefused) {
  Safetensors st;
  st.tensors["w"] = RawTensor::FromVector<float>({1, 2, 3, 4}, {4});
  st.tensors["b"] = RawTensor::FromVector<uint8_t>({7, 8}, {2});
  std::string bytes = *SerializeSafetensors(st);
  bytes[bytes.size() - 2 - 16 + 5] ^= 0x10;  // in w (F32 first, then U8)
  const std::string path = TestDir() + "/flipped.safetensors";
  WriteFile(path, bytes);
  EXPECT_TRUE(IsError(LoadSafetensors(path).status(), absl::StatusCode::kDataLoss,
                      "safetensors file '" + path +
                          "': tensor 'w': CRC-32 of its 16 bytes is 2551d09f, the header records "
                          "8ba71454 (the data is corrupt)"));
  EXPECT_TRUE(HasError(ParseSafetensors(bytes).status(), absl::StatusCode::kDataLoss,
                       "tensor 'w': CRC-32 of its 16 bytes is 2551d09f"));
  bytes[bytes.size() - 1] ^= 1;  // and in b
  bytes[bytes.size() - 2 - 16 + 5] ^= 0x10;
  EXPECT_TRUE(HasError(ParseSafetensors(bytes).status(), absl::StatusCode::kDataLoss,
                       "tensor 'b': CRC-32 of its 2 bytes is"));
}

// The whole header is checksummed (kHeaderChecksumKey): a changed metadata value or a tensor's
// dtype that keeps the layout valid, which no per-tensor CRC sees, is refused.
TEST(SafetensorsTest, ChangedHeaderValueIsRefused) {
  Safetensors st;
  st.tensors["w"] = RawTensor::FromVector<float>({1, 2, 3, 4}, {4});
  st.metadata["scalar:lr"] = "0.001";
  const std::string bytes = *SerializeSafetensors(st);
  // Python: "%08x" % zlib.crc32(b'{"__metadata__":{"crc32:w":"8ba71454","scalar:lr":"0.001"},'
  //                             b'"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}')
  ASSERT_NE(bytes.find(R"("crc32:__metadata__":"d0a94c2b")"), std::string::npos);
  ASSERT_TRUE(ParseSafetensors(bytes).ok());

  std::string lr = bytes;
  lr.replace(lr.find("\"0.001\""), 7, "\"1.001\"");  // one digit
  // Python: the same text with "1.001"
  EXPECT_TRUE(IsError(ParseSafetensors(lr).status(), absl::StatusCode::kDataLoss,
                      "safetensors buffer: the header's CRC-32 is 66b2ac5b, its \"__metadata__\" "
                      "entry 'crc32:__metadata__' records d0a94c2b (the header is corrupt: a "
                      "metadata value or a tensor's entry changed)"));
  const std::string path = TestDir() + "/lr.safetensors";
  WriteFile(path, lr);
  EXPECT_TRUE(HasError(LoadStateDict(path).status(), absl::StatusCode::kDataLoss,
                       "safetensors file '" + path + "': the header's CRC-32 is 66b2ac5b"));

  std::string dtype = bytes;  // F32 -> I32: the same bytes and layout, other values
  dtype.replace(dtype.find("\"F32\""), 5, "\"I32\"");
  EXPECT_TRUE(HasError(ParseSafetensors(dtype).status(), absl::StatusCode::kDataLoss,
                       "the header's CRC-32 is"));

  std::string text = bytes;  // not a checksum at all
  text.replace(text.find("d0a94c2b"), 8, "d0a94c2z");
  EXPECT_TRUE(IsError(ParseSafetensors(text).status(), absl::StatusCode::kInvalidArgument,
                      "safetensors buffer: \"__metadata__\" entry 'crc32:__metadata__' has the "
                      "value 'd0a94c2z'; expected a CRC-32 as 8 lowercase hex digits"));
}

TEST(SafetensorsTest, FilesWithoutChecksumsLoad) {
  const std::string header = R"({"__metadata__":{"k":"v"},"w":)"
                             R"({"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
  absl::StatusOr<Safetensors> st =
      ParseSafetensors(MakeFile(header, std::string("\1\0\0\0\2\0\0\0", 8)));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->tensors.at("w").to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(st->metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  // A file with the checksum of one tensor only checks that one.
  const std::string some = R"({"__metadata__":{"crc32:a":"00000000"},)"
                           R"("a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                           R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_TRUE(ParseSafetensors(MakeFile(some, "xy")).ok());
}

TEST(SafetensorsTest, ChecksumEntryErrors) {
  using C = absl::StatusCode;
  auto file = [](const std::string& key, const std::string& value) {
    return MakeFile(R"({"__metadata__":{")" + key + R"(":")" + value + R"("},)" +
                        R"("w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                    "abcd");
  };
  // Python: "%08x" % zlib.crc32(b"abcd")
  EXPECT_TRUE(ParseSafetensors(file("crc32:w", "ed82cd11")).ok());
  EXPECT_TRUE(IsError(ParseSafetensors(file("crc32:v", "ed82cd11")).status(), C::kInvalidArgument,
                      "safetensors buffer: \"__metadata__\" entry 'crc32:v' records a checksum of "
                      "tensor 'v', which the file does not hold"));
  for (const char* bad : {"ED82CD11", "ed82cd1", "ed82cd110", "ed82cd1g", " d82cd11", ""}) {
    EXPECT_TRUE(IsError(ParseSafetensors(file("crc32:w", bad)).status(), C::kInvalidArgument,
                        absl::StrCat("safetensors buffer: \"__metadata__\" entry 'crc32:w' has "
                                     "the value '",
                                     bad, "'; expected a CRC-32 as 8 lowercase hex digits")));
  }
  // The writer keeps the prefix to itself.
  Safetensors st;
  st.metadata["crc32:w"] = "00000000";
  EXPECT_TRUE(IsError(SerializeSafetensors(st).status(), C::kInvalidArgument,
                      "SerializeSafetensors: metadata key 'crc32:w' uses the reserved prefix "
                      "'crc32:' (the writer records each tensor's checksum there)"));
  const std::string dir = TestDir();
  EXPECT_TRUE(IsError(SaveStateDict(dir + "/sd.safetensors", StateDict{}, {{"crc32:x", "1"}}),
                      C::kInvalidArgument,
                      "SaveStateDict: metadata key 'crc32:x' uses the reserved prefix 'crc32:'"));
  EXPECT_TRUE(fs::is_empty(dir));
}

// ---- files -----------------------------------------------------------------------------------

TEST(SafetensorsTest, LoadMissingFileIsNotFound) {
  const std::string path = TestDir() + "/nope.safetensors";
  EXPECT_TRUE(HasError(LoadSafetensors(path).status(), absl::StatusCode::kNotFound,
                       "LoadSafetensors: cannot open '" + path + "': No such file or directory"));
}

TEST(SafetensorsTest, LoadDirectoryIsRejected) {
  const std::string dir = TestDir();
  EXPECT_TRUE(HasError(LoadSafetensors(dir).status(), absl::StatusCode::kInvalidArgument,
                       "LoadSafetensors: '" + dir + "' is not a regular file"));
}

TEST(SafetensorsTest, CorruptFileNamesThePath) {
  const std::string path = TestDir() + "/cut.safetensors";
  Safetensors st;
  st.tensors["w"] = RawTensor::Ones({4}, kF32);
  const std::string bytes = *SerializeSafetensors(st);
  WriteFile(path, bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(HasError(LoadSafetensors(path).status(), absl::StatusCode::kDataLoss,
                       "safetensors file '" + path +
                           "': tensor 'w': data_offsets [0, 16] end beyond the data buffer of 15 "
                           "bytes (truncated file?)"));
  WriteFile(path, "");
  EXPECT_TRUE(HasError(LoadSafetensors(path).status(), absl::StatusCode::kDataLoss,
                       "safetensors file '" + path + "': 0 bytes is too short"));
  WriteFile(path, bytes);
  EXPECT_TRUE(LoadSafetensors(path).ok());
}

TEST(SafetensorsTest, SaveReplacesExistingFileAndLeavesNoTempFile) {
  const std::string dir = TestDir();
  const std::string path = dir + "/ckpt.safetensors";
  Safetensors first;
  first.tensors["w"] = RawTensor::Full({1000}, 1.0, kF32);
  first.metadata["v"] = "1";
  ASSERT_TRUE(SaveSafetensors(path, first).ok());
  Safetensors second;
  second.tensors["w"] = RawTensor::Full({3}, 2.0, kF64);
  second.metadata["v"] = "2";
  ASSERT_TRUE(SaveSafetensors(path, second).ok());
  absl::StatusOr<Safetensors> back = LoadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameSafetensors(second, *back);
  EXPECT_TRUE(TempFiles(dir).empty());
  // A path without a directory part works too (relative to the working directory).
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  EXPECT_TRUE(SaveSafetensors("relative.safetensors", second).ok());
  fs::current_path(cwd);
  EXPECT_TRUE(fs::exists(dir + "/relative.safetensors"));
  EXPECT_TRUE(TempFiles(dir).empty());
}

TEST(SafetensorsTest, SaveIntoMissingDirectoryFails) {
  const std::string dir = TestDir();
  const std::string path = dir + "/no/such/dir/ckpt.safetensors";
  Safetensors st;
  st.tensors["w"] = RawTensor::Ones({2});
  const absl::Status status = SaveSafetensors(path, st);
  EXPECT_TRUE(HasError(status, absl::StatusCode::kNotFound,
                       "SaveSafetensors: cannot create '" + path + ".tmp."));
  // The failed cleanup before it is reported with it.
  EXPECT_TRUE(HasError(status, absl::StatusCode::kNotFound,
                       ": No such file or directory (and before the save: RemoveStaleTemporaries: "
                       "cannot list '" +
                           dir + "/no/such/dir': No such file or directory)"));
  EXPECT_TRUE(fs::is_empty(dir));
}

// The rename fails (a directory sits at the target path) after the data was written: the
// temporary file is removed and the directory is untouched.
TEST(SafetensorsTest, FailedRenameRemovesTempFile) {
  const std::string dir = TestDir();
  const std::string path = dir + "/taken";
  fs::create_directory(path);
  Safetensors st;
  st.tensors["w"] = RawTensor::Ones({2});
  const absl::Status status = SaveSafetensors(path, st);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("SaveSafetensors: rename '" + path + ".tmp."), std::string::npos)
      << status;
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_TRUE(TempFiles(dir).empty());
}

// A write that fails midway (the file-size limit, as on a full disk) leaves the previous file
// intact and no temporary file behind.
TEST(SafetensorsTest, FailedWriteKeepsPreviousFile) {
  const std::string dir = TestDir();
  const std::string path = dir + "/ckpt.safetensors";
  Safetensors old_st;
  old_st.tensors["w"] = RawTensor::Full({4}, 3.0, kF32);
  ASSERT_TRUE(SaveSafetensors(path, old_st).ok());
  const std::string old_bytes = ReadFile(path);

  Safetensors big;
  big.tensors["w"] = RawTensor::Zeros({1 << 18}, kF32);  // 1 MiB
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  auto* previous_handler = signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  const absl::Status status = SaveSafetensors(path, big);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  signal(SIGXFSZ, previous_handler);

  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("SaveSafetensors: writing '" + path + ".tmp."), std::string::npos)
      << status;
  EXPECT_EQ(ReadFile(path), old_bytes);
  EXPECT_TRUE(TempFiles(dir).empty());
  absl::StatusOr<Safetensors> back = LoadSafetensors(path);
  ASSERT_TRUE(back.ok());
  ExpectSameSafetensors(old_st, *back);
}

// ---- stale temporaries -------------------------------------------------------------------------

// The pid of a process that has exited and been reaped.
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  EXPECT_GT(child, 0);
  int wstatus;
  EXPECT_EQ(waitpid(child, &wstatus, 0), child);
  return child;
}

std::vector<std::string> SortedNames(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.push_back(entry.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SafetensorsTest, RemoveStaleTemporariesRemovesOnlyDeadWritersFiles) {
  const std::string dir = TestDir();
  const std::string dead = std::to_string(DeadPid());
  const std::string live = std::to_string(getpid());
  const std::vector<std::string> stale = {
      "ckpt.safetensors.tmp." + dead + ".0",
      "ckpt.safetensors.tmp." + dead + ".17",
  };
  const std::vector<std::string> kept = {
      "ckpt.safetensors",
      "ckpt.safetensors.tmp." + live + ".0",      // a live writer (this process)
      "other.safetensors.tmp." + dead + ".0",     // another file's
      "xckpt.safetensors.tmp." + dead + ".0",     // another file's, sharing the suffix
      "ckpt.safetensors.tmp." + dead,             // no counter
      "ckpt.safetensors.tmp." + dead + ".",       // empty counter
      "ckpt.safetensors.tmp." + dead + ".3.bak",  // something after it
      "ckpt.safetensors.tmp." + dead + ".1a",     // not digits
      "ckpt.safetensors.tmp.x" + dead + ".1",     // not digits
      "ckpt.safetensors.tmp.+" + dead + ".1",     // a sign
      "ckpt.safetensors.tmp.." + dead,            // empty pid
      "ckpt.safetensors.tmp.0.1",                 // no process has pid 0
      "ckpt.safetensors.tmp.99999999999.1",       // beyond pid_t
      "ckpt.safetensors.tmp.4294967297.1",        // beyond pid_t (1 modulo 2^32)
      "ckpt.safetensorstmp." + dead + ".1",       // not ".tmp."
      "x.tmp.12",
      "x.tmp." + dead,
      "x.tmp." + dead + ".3.bak",
  };
  for (const std::string& name : stale) WriteFile(dir + "/" + name, "stale");
  for (const std::string& name : kept) WriteFile(dir + "/" + name, "keep");
  // A directory with a matching name is not a temporary file.
  const std::string dir_name = "ckpt.safetensors.tmp." + dead + ".5";
  fs::create_directory(dir + "/" + dir_name);
  std::vector<std::string> expected = kept;
  expected.push_back(dir_name);
  std::sort(expected.begin(), expected.end());

  absl::StatusOr<int> removed = RemoveStaleTemporaries(dir + "/ckpt.safetensors");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_EQ(SortedNames(dir), expected);
  // Nothing left to do; the path "x" matches none of the "x.tmp." names either.
  EXPECT_EQ(*RemoveStaleTemporaries(dir + "/ckpt.safetensors"), 0);
  EXPECT_EQ(*RemoveStaleTemporaries(dir + "/x"), 0);
  EXPECT_EQ(SortedNames(dir), expected);

  // A path relative to the working directory.
  WriteFile(dir + "/x.tmp." + dead + ".4", "stale");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  removed = RemoveStaleTemporaries("x");
  fs::current_path(cwd);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 1);
  EXPECT_EQ(SortedNames(dir), expected);
}

TEST(SafetensorsTest, RemoveStaleTemporariesErrors) {
  const std::string dir = TestDir();
  EXPECT_TRUE(IsError(
      RemoveStaleTemporaries(dir + "/missing/ckpt").status(), absl::StatusCode::kNotFound,
      "RemoveStaleTemporaries: cannot list '" + dir + "/missing': No such file or directory"));
  EXPECT_TRUE(IsError(RemoveStaleTemporaries(dir + "/").status(),
                      absl::StatusCode::kInvalidArgument,
                      "RemoveStaleTemporaries: '" + dir + "/' names a directory, not a file"));
}

// A save first removes what a killed save of the same path left, and nothing of a live one.
TEST(SafetensorsTest, SaveRemovesStaleTemporaries) {
  const std::string dir = TestDir();
  const std::string path = dir + "/ckpt.safetensors";
  const std::string stale = path + ".tmp." + std::to_string(DeadPid()) + ".0";
  const std::string live = path + ".tmp." + std::to_string(getpid()) + ".999999";
  WriteFile(stale, std::string(1000, 'x'));
  WriteFile(live, "in progress");
  Safetensors st;
  st.tensors["w"] = RawTensor::Ones({2});
  ASSERT_TRUE(SaveSafetensors(path, st).ok());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(TempFiles(dir), (std::vector<std::string>{fs::path(live).filename()}));
  EXPECT_TRUE(LoadSafetensors(path).ok());
}

}  // namespace
}  // namespace io
}  // namespace tg
