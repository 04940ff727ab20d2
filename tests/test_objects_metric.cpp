#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "datasets/io.hpp"
#include "train/evaluate.hpp"
#include "train/object_mentions.hpp"
#include "train/ptb_tokenizer.hpp"
#include "train/trainer_steps.hpp"
#include "vision/detector.hpp"

using namespace sat;

namespace {

int group(const std::string& name) {
  const auto& groups = object_groups();
  for (int g = 0; g < (int)groups.size(); ++g)
    if (groups[g].name == name) return g;
  FAIL("no object group " << name);
  return -1;
}

// The groups a caption names, by name.
std::set<std::string> named(const std::string& caption) {
  std::set<std::string> out;
  const std::vector<bool> n = objects_named(ptb_tokenize(caption));
  for (size_t g = 0; g < n.size(); ++g)
    if (n[g]) out.insert(object_groups()[g].name);
  return out;
}

const ObjectRow& row(const ObjectTable& t, const std::string& name) {
  return t.rows.at(group(name));
}

}  // namespace

TEST_CASE("objects: the twelve groups, person and dog not pooled with the rarer ones") {
  const std::vector<std::string> expected = {"person",    "dog",     "bicycle",    "ball",
                                             "horse",     "boat",    "car",        "skateboard",
                                             "surfboard", "frisbee", "motorcycle", "snow sports"};
  REQUIRE(object_groups().size() == expected.size());
  for (size_t g = 0; g < expected.size(); ++g) {
    CHECK(object_groups()[g].name == expected[g]);
    CHECK(object_groups()[g].rare == (g >= 2));
  }
  // Every listed word survives the tokenizer whole and names its own group only.
  for (const ObjectGroup& g : object_groups())
    for (const std::string& w : g.words) {
      CHECK_MESSAGE(ptb_tokenize(w) == Tokens{w}, w);
      CHECK_MESSAGE(named(w) == std::set<std::string>{g.name}, w);
    }
}

TEST_CASE("objects: whole tokens after the caption tokenization, any case, punctuation split off") {
  CHECK(named("A Dog runs.") == std::set<std::string>{"dog"});
  CHECK(named("two DOGS.") == std::set<std::string>{"dog"});
  CHECK(named("the dogs, running") == std::set<std::string>{"dog"});
  CHECK(named("a dog's ball") == std::set<std::string>{"dog", "ball"});
  CHECK(named("an underdog , dogged and doggedly").empty());  // parts of words name nothing
  CHECK(named("a man with his puppies") == std::set<std::string>{"person", "dog"});
  CHECK(named("Women and children.") == std::set<std::string>{"person"});
  CHECK(named("a skier on the slope") == std::set<std::string>{"snow sports"});  // activity nouns: not person words
  CHECK(named("a football player") == std::set<std::string>{"person"});          // football: the sport, not a ball
  CHECK(named("a boy kicks a soccer ball") == std::set<std::string>{"person", "ball"});
  CHECK(named("a surfer rides the surf").count("surfboard") == 1);
  CHECK(named("waves crash in the surf").empty());
  CHECK(named("a frisbee").count("frisbee") == 1);
  CHECK(named("a Frisbee!") == std::set<std::string>{"frisbee"});
}

TEST_CASE("objects: two-word phrases first, their words then name nothing else") {
  CHECK(named("a man rides a dirt bike") == std::set<std::string>{"person", "motorcycle"});
  CHECK(named("a dirt bike beside a bike") == std::set<std::string>{"motorcycle", "bicycle"});
  CHECK(named("a dirt-bike") == std::set<std::string>{"motorcycle"});
  CHECK(named("a bike on dirt") == std::set<std::string>{"bicycle"});
  CHECK(named("a jet ski") == std::set<std::string>{"boat"});
  CHECK(named("a german shepherd") == std::set<std::string>{"dog"});
  CHECK(named("a man eats a hot dog") == std::set<std::string>{"person"});
  CHECK(named("water skiing behind a boat") == std::set<std::string>{"boat"});
  CHECK(named("skiing on the water") == std::set<std::string>{"snow sports"});
}

TEST_CASE("objects: the group a single word names by itself, as the beam's steering reads a vocabulary") {
  auto index = [](const std::string& name) {
    for (size_t g = 0; g < object_groups().size(); ++g)
      if (object_groups()[g].name == name) return (int)g;
    return -2;
  };
  CHECK(object_group_of_word("horse") == index("horse"));
  CHECK(object_group_of_word("skiers") == index("snow sports"));
  CHECK(object_group_of_word("puppy") == index("dog"));
  CHECK(object_group_of_word("bike") == index("bicycle"));  // by itself; "dirt bike" is a phrase of the motorcycle
  CHECK(object_group_of_word("dirt") == -1);
  CHECK(object_group_of_word("Horse") == -1);  // tokens are lower case
  CHECK(object_group_of_word("grass") == -1);
  CHECK(object_group_of_word("") == -1);
  for (size_t g = 0; g < object_groups().size(); ++g)  // every group's every word
    for (const std::string& w : object_groups()[g].words) CHECK(object_group_of_word(w) == (int)g);
}

TEST_CASE("objects: photos, recall, false mentions and the rarer objects pooled") {
  const std::vector<std::vector<std::string>> refs = {
      // 0: three of five name the dog (a dog photo); the horse only twice (neither a horse photo nor one without)
      {"A dog runs .", "Two dogs play", "a puppy in the grass", "a horse and a man", "A man rides a horse"},
      // 1: five name the dog and three the ball
      {"a dog with a ball", "a Dog catches a ball .", "dog and ball", "the dog jumps", "a brown dog"},
      // 2: no reference names a dog, a ball or a horse
      {"a man on a bench", "a person sits", "someone resting", "a man", "an old man reading"},
      // 3: one reference, naming a horse: enough when there are fewer than three
      {"a horse in a field"},
  };
  const std::vector<std::string> caps = {"a dog on the grass", "a cat catches a ball", "a dog and a horse",
                                         "a brown horse"};
  const ObjectTable t = object_table(caps, refs);
  REQUIRE(t.rows.size() == object_groups().size());

  const ObjectRow& dog = row(t, "dog");
  CHECK(dog.photos == 2);
  CHECK(dog.named == 1);
  CHECK(dog.recall() == doctest::Approx(0.5));
  CHECK(dog.unnamed_photos == 2);  // photos 2 and 3
  CHECK(dog.false_mentions == 1);  // photo 2's caption

  const ObjectRow& horse = row(t, "horse");
  CHECK(horse.photos == 1);  // photo 3 (photo 0: two of five)
  CHECK(horse.named == 1);
  CHECK(horse.unnamed_photos == 2);  // photos 1 and 2
  CHECK(horse.false_mentions == 1);  // photo 2

  const ObjectRow& ball = row(t, "ball");
  CHECK(ball.photos == 1);
  CHECK(ball.named == 1);
  CHECK(ball.unnamed_photos == 3);
  CHECK(ball.false_mentions == 0);

  const ObjectRow& person = row(t, "person");
  CHECK(person.photos == 1);  // photo 2 (photo 0 has two man references)
  CHECK(person.named == 0);
  CHECK(person.recall() == 0.0);

  CHECK(row(t, "frisbee").photos == 0);
  CHECK(row(t, "frisbee").unnamed_photos == 4);

  // pooled: ball and horse only (dog and person are not rarer objects)
  CHECK(t.rare.photos == 2);
  CHECK(t.rare.named == 2);
  CHECK(t.rare.false_mentions == 1);
  CHECK(t.rare.unnamed_photos ==
        10 * 4 - 3);  // ten rarer groups over four photos, less the horse's 0 and 3, the ball's 1

  CHECK_THROWS_WITH_AS(object_table({"a dog"}, {}), "object table: captions and references differ in number", Error);
  const ObjectTable empty = object_table({}, {});
  CHECK(empty.rows.size() == object_groups().size());
  CHECK(empty.rare.photos == 0);
}

TEST_CASE("objects: text, JSON, and a part of the caption scores") {
  const std::vector<std::vector<std::string>> refs = {{"a dog runs", "a dog", "the dog", "a man", "grass"},
                                                      {"a man", "a man", "a man", "a man", "a man"}};
  const std::vector<std::string> caps = {"a dog runs", "a dog"};
  const CaptionScores s = score_captions(caps, refs);
  REQUIRE(s.objects.rows.size() == object_groups().size());
  CHECK(row(s.objects, "dog").photos == 1);
  CHECK(row(s.objects, "dog").named == 1);
  CHECK(row(s.objects, "dog").false_mentions == 1);
  CHECK(row(s.objects, "dog").unnamed_photos == 1);
  CHECK(row(s.objects, "person").photos == 1);
  CHECK(row(s.objects, "person").named == 0);

  const std::string text = s.table();
  CHECK(text.find("CIDEr") < text.find("objects named   photos  named recall  false     none\n"));
  CHECK(text.find("  dog                1      1  1.000      1        1\n") != std::string::npos);
  CHECK(text.find("  person             1      0  0.000      0        0\n") != std::string::npos);
  CHECK(text.find("  frisbee            0      0      -      0        2\n") != std::string::npos);
  CHECK(text.find("  rarer objects      0      0      -      0       20\n") != std::string::npos);

  const nlohmann::json j = s.to_json();
  CHECK(j["objects"]["groups"][1]["name"] == "dog");
  CHECK(j["objects"]["groups"][1]["recall"] == 1.0);
  CHECK(j["objects"]["groups"][9]["recall"].is_null());  // frisbee: no photo
  CHECK(j["objects"]["rare"]["unnamed_photos"] == 20);
  const CaptionScores back = CaptionScores::from_json(j);
  CHECK(back.objects.to_json() == j["objects"]);
  CHECK(back.table() == text);

  // scores recorded before the table have none, and print none
  nlohmann::json old = j;
  old.erase("objects");
  const CaptionScores before = CaptionScores::from_json(old);
  CHECK(before.objects.rows.empty());
  CHECK(before.table().find("objects") == std::string::npos);
  CHECK(!before.to_json().contains("objects"));
}

TEST_CASE("objects: the detector's evidence per group, read from a grid's object channels") {
  const std::vector<std::string>& classes = coco_class_names();
  for (const auto& g : object_groups()) {  // every group's classes are the detector's
    CAPTURE(g.name);
    CHECK(!g.coco_classes.empty());
    for (const auto& c : g.coco_classes) CHECK(std::find(classes.begin(), classes.end(), c) != classes.end());
  }
  // A grid of 3 locations: 2 channels of its own, then the 80 classes times a scale of 4.
  const int own = 2, C = (int)classes.size();
  Mat grid = Mat::Zero(3, own + C);
  auto cls = [&](const std::string& name) { return own + int(std::find(classes.begin(), classes.end(), name) - classes.begin()); };
  grid(0, 0) = 9;  // the grid's own channels are not evidence
  grid(1, cls("dog")) = 4 * 0.6f;
  grid(2, cls("dog")) = 4 * 0.2f;  // a class's peak is its largest value over the grid
  grid(0, cls("skis")) = 4 * 0.1f;
  grid(2, cls("snowboard")) = 4 * 0.3f;  // a group's peak: the highest of its classes
  grid(1, cls("cat")) = 4 * 0.9f;        // no group's
  const std::vector<double> peaks = object_group_peaks(grid, own, 4.f, classes);
  REQUIRE(peaks.size() == object_groups().size());
  for (size_t g = 0; g < peaks.size(); ++g) {
    const std::string& name = object_groups()[g].name;
    CAPTURE(name);
    const double want = name == "dog" ? 0.6 : name == "snow sports" ? 0.3 : 0.0;
    CHECK(peaks[g] == doctest::Approx(want).epsilon(1e-6));
  }
  // evidence: the sum over the groups a caption names of (peak - threshold)
  CHECK(object_evidence(ptb_tokenize("a dog runs"), peaks, 0.15) == doctest::Approx(0.45));
  CHECK(object_evidence(ptb_tokenize("two dogs and a snowboarder"), peaks, 0.15) == doctest::Approx(0.45 + 0.15));
  CHECK(object_evidence(ptb_tokenize("a man rides a horse"), peaks, 0.15) == doctest::Approx(-0.15 - 0.15));
  CHECK(object_evidence(ptb_tokenize("a hot dog"), peaks, 0.15) == 0);  // a phrase that names no object
  CHECK(object_evidence(ptb_tokenize("the grass"), peaks, 0.15) == 0);
  // a grid without the object channels, and peaks of the wrong length, are errors
  CHECK_THROWS_AS(object_group_peaks(Mat::Zero(3, own + 10), own, 4.f, classes), Error);
  CHECK_THROWS_AS(object_group_peaks(grid, own, 0.f, classes), Error);
  CHECK_THROWS_AS(object_evidence(ptb_tokenize("a dog"), {0.5}, 0.1), Error);
}

TEST_CASE("objects: the rarer groups' words get the trainer's object word weight, other words 1") {
  const Vocab vocab = Vocab::from_words({"<pad>", "<start>", "<end>", "<unk>", "a", "dog", "ball", "horse", "man",
                                         "grass", "surfer", "dirt"},
                                        "test");
  CHECK(trainer::object_word_weights(vocab, 1.f).empty());  // 1: no weights at all
  const std::vector<float> w = trainer::object_word_weights(vocab, 3.f);
  REQUIRE(w.size() == vocab.words.size());
  for (const char* rarer : {"ball", "horse", "surfer"}) CHECK(w[vocab.id(rarer)] == 3.f);
  for (const char* other : {"<end>", "a", "dog", "man", "grass", "dirt"}) CHECK(w[vocab.id(other)] == 1.f);
}
