#include "worker/train/data/tiny_corpus.h"

#include <cmath>
#include <map>

#include "worker/train/rng.h"

namespace loom::train {
namespace {

constexpr size_t kCorpusBytes = 64 * 1024;
constexpr uint64_t kCorpusSeed = 0x7417c0de;  // fixed: the corpus is part of the product

// The grammar's word lists. Nouns come in (singular, plural) pairs; verbs in (3rd person
// singular, plural) pairs, so agreement with the subject is something to learn.
const char* const kAdjectives[] = {"small", "red",   "old",    "quiet", "happy",
                                   "green", "brave", "little", "tall",  "bright"};
const char* const kNouns[][2] = {{"cat", "cats"},         {"dog", "dogs"},       {"bird", "birds"},
                                 {"child", "children"},   {"farmer", "farmers"}, {"fox", "foxes"},
                                 {"teacher", "teachers"}, {"horse", "horses"}};
const char* const kVerbs[][2] = {{"sees", "see"},      {"likes", "like"},     {"finds", "find"},
                                 {"watches", "watch"}, {"follows", "follow"}, {"helps", "help"}};
const char* const kIntransitive[][2] = {
    {"runs", "run"}, {"sleeps", "sleep"}, {"sings", "sing"}, {"waits", "wait"}};
const char* const kPlaces[] = {"house", "river", "garden", "hill", "road", "forest"};
const char* const kPrepositions[] = {"near", "behind", "under", "across"};
const char* const kNames[] = {"anna", "ben", "clara", "david"};

template <typename T, size_t N>
const T& Pick(Rng& rng, const T (&items)[N]) {
  return items[rng.NextBelow(N)];
}

// Appends "the [adjective] noun" (or "a ..." in the singular) in the given number.
void NounPhrase(Rng& rng, bool plural, std::string* out) {
  *out += rng.NextBelow(4) == 0 && !plural ? "a " : "the ";
  if (rng.NextBelow(2) == 0) {
    *out += Pick(rng, kAdjectives);
    *out += ' ';
  }
  *out += Pick(rng, kNouns)[plural ? 1 : 0];
}

void Sentence(Rng& rng, std::string* out) {
  std::string s;
  uint64_t kind = rng.NextBelow(10);
  if (kind < 2) {  // a name says something: anna says that the cat runs.
    s += Pick(rng, kNames);
    s += rng.NextBelow(2) ? " says that " : " thinks that ";
  }
  const bool plural = rng.NextBelow(3) == 0;
  NounPhrase(rng, plural, &s);
  s += ' ';
  if (rng.NextBelow(3) == 0) {
    s += Pick(rng, kIntransitive)[plural ? 1 : 0];
    s += ' ';
    s += Pick(rng, kPrepositions);
    s += " the ";
    s += Pick(rng, kPlaces);
  } else {
    s += Pick(rng, kVerbs)[plural ? 1 : 0];
    s += ' ';
    NounPhrase(rng, rng.NextBelow(3) == 0, &s);
    if (rng.NextBelow(4) == 0) {
      s += " in the ";
      s += Pick(rng, kPlaces);
    }
  }
  if (kind == 9) {  // a second clause joined by "and"
    s += " and ";
    const bool plural2 = rng.NextBelow(3) == 0;
    NounPhrase(rng, plural2, &s);
    s += ' ';
    s += Pick(rng, kIntransitive)[plural2 ? 1 : 0];
  }
  s[0] = static_cast<char>(s[0] - 'a' + 'A');  // sentences start with a capital
  *out += s;
  *out += '.';
}

}  // namespace

std::string TinyCorpusText() {
  Rng rng(kCorpusSeed);
  std::string text;
  text.reserve(kCorpusBytes + 256);
  while (text.size() < kCorpusBytes) {
    const uint64_t sentences = 3 + rng.NextBelow(4);  // a paragraph of 3 to 6 sentences
    for (uint64_t i = 0; i < sentences; ++i) {
      if (i > 0) text += ' ';
      Sentence(rng, &text);
    }
    text += '\n';
  }
  text.resize(kCorpusBytes);
  return text;
}

std::vector<uint16_t> TinyCorpusTokens() {
  std::string text = TinyCorpusText();
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

double UnigramEntropy(const std::vector<uint16_t>& tokens) {
  std::map<uint16_t, size_t> counts;
  for (uint16_t t : tokens) ++counts[t];
  double h = 0.0;
  for (const auto& [token, n] : counts) {
    double p = static_cast<double>(n) / tokens.size();
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace loom::train
