# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require "stackprof"

class TestProfileFile < Minitest::Test
  module Work
    module_function

    def run(n)
      n.times { |i| i % 3 == 0 ? left : right }
    end

    def left = Strobe.sample
    def right = [0].each { Strobe.sample }
  end

  def setup
    @dir = Dir.mktmpdir("strobe-test")
  end

  def teardown
    super
    FileUtils.remove_entry(@dir)
  end

  def profile(n = 30, **opts)
    Strobe.run(mode: :custom, raw: true, metadata: { app: "test" }, **opts) { Work.run(n) }
  end

  def test_out_path_writes_json_that_loads_back_identically
    path = File.join(@dir, "p.json")
    assert_equal path, profile(out: path)
    assert_equal "{", File.read(path, 1)
    loaded = Strobe.load(path)
    assert_equal 30, loaded[:samples]
    assert_equal({ app: "test" }, loaded[:metadata])
    assert_equal [path], Dir[File.join(@dir, "*")], "no temporary file is left behind"
  end

  def test_round_trip_is_exact
    result = profile
    path = File.join(@dir, "p.json")
    Strobe.save(result, path)
    assert_equal result, Strobe.load(path)
  end

  def test_gz_suffix_gzips
    result = profile
    path = File.join(@dir, "p.json.gz")
    Strobe.save(result, path)
    assert_equal "\x1f\x8b".b, File.binread(path, 2)
    assert_equal result, Strobe.load(path)
  end

  def test_out_io
    io = StringIO.new
    assert_same io, profile(out: io)
    assert_equal 30, Strobe::ProfileFile.parse(io.string)[:samples]
  end

  def test_raw_arrays_are_not_stored_in_the_file
    result = profile
    path = File.join(@dir, "p.json")
    Strobe.save(result, path)
    doc = JSON.parse(File.read(path))
    refute doc.key?("raw")
    refute doc.key?("raw_sample_timestamps")
    assert_equal 30, doc["stacks"]["samples"].size
  end

  def test_compact_size_per_raw_sample
    result = Strobe.run(mode: :custom, raw: true) { Work.run(20_000) }
    json = File.join(@dir, "p.json")
    gz = File.join(@dir, "p.json.gz")
    Strobe.save(result, json)
    Strobe.save(result, gz)
    assert_operator File.size(json).fdiv(20_000), :<, 19
    assert_operator File.size(gz).fdiv(20_000), :<, 5
  end

  def test_loads_a_stackprof_result_saved_as_json
    result = StackProf.run(mode: :custom, raw: true) { 3.times { StackProf.sample } }
    path = File.join(@dir, "stackprof.json")
    File.write(path, JSON.generate(result))
    loaded = Strobe.load(path)
    assert_equal result[:frames].keys.sort, loaded[:frames].keys.sort
    assert_equal 3, loaded[:samples]
    assert_equal result[:raw], loaded[:raw]
  end

  def test_saves_a_stackprof_result_compactly
    result = StackProf.run(mode: :custom, raw: true) { 3.times { StackProf.sample } }
    path = File.join(@dir, "p.json")
    Strobe.save(result, path)
    loaded = Strobe.load(path)
    assert_equal result[:raw], loaded[:raw]
    assert_equal result[:raw_lines], loaded[:raw_lines]
    assert_equal result[:raw_sample_timestamps], loaded[:raw_sample_timestamps]
  end

  def test_save_rejects_raw_referring_to_unknown_frames
    result = profile
    result[:raw] = result[:raw].dup
    result[:raw][1] = 123_456_789
    error = assert_raises(Strobe::ProfileError) { Strobe.save(result, File.join(@dir, "p.json")) }
    assert_match(/frame 123456789 that is not in frames/, error.message)
  end

  def assert_corrupt(bytes, message)
    path = File.join(@dir, "bad.json")
    File.binwrite(path, bytes)
    error = assert_raises(Strobe::ProfileError) { Strobe.load(path) }
    assert_match message, error.message
    assert_includes error.message, path
  end

  def test_corrupt_files_raise_profile_error
    good = JSON.generate(Strobe::ProfileFile.encode(profile))
    assert_corrupt "", /empty/
    assert_corrupt good[0, good.size / 2], /not valid JSON/
    assert_corrupt "hello", /not valid JSON/
    assert_corrupt "[1,2]", /not a profile/
    assert_corrupt Zlib.gzip(good)[0, 30], /gzip data is corrupt/
    assert_corrupt Marshal.dump({ frames: {} }), /Marshal/
    assert_corrupt good.sub('"strobe_file":1', '"strobe_file":99'), /format 99 is not supported/
  end

  def test_values_of_the_wrong_type_raise_profile_error
    doc = Strobe::ProfileFile.encode(profile)
    assert_corrupt JSON.generate(doc.merge(gc_samples: [])), /gc_samples is not a non-negative integer below 2\*\*64: \[\]/
    assert_corrupt JSON.generate(doc.merge(missed_samples: -3)), /missed_samples is not a non-negative integer below 2\*\*64: -3/
    assert_corrupt JSON.generate(doc.merge(mode: "c\u00fcstom")), /mode "c.stom" is not a mode/
    assert_corrupt JSON.generate(doc.merge(interval: "1")), /interval is not an integer/
    assert_corrupt JSON.generate(doc.merge(threads: [1, 2])), /a thread is not an object/
    assert_corrupt JSON.generate({ mode: "cpu", samples: 1, frames: { "1": 5 } }), /frame 1 is malformed/
    frames = doc[:frames].map { |f| f.merge(total_samples: 2**70) }
    assert_corrupt JSON.generate(doc.merge(frames: frames)), /total_samples is not a non-negative integer|out of range/
    frames = doc[:frames].map { |f| f.merge(edges: [["x", 1]]) }
    assert_corrupt JSON.generate(doc.merge(frames: frames)), /has an edge to "x"/
  end

  def test_corrupt_stacks_raise_profile_error
    doc = Strobe::ProfileFile.encode(profile)
    bad_node = Marshal.load(Marshal.dump(doc))
    bad_node[:stacks][:samples][0] = 10_000
    assert_corrupt JSON.generate(bad_node), /sample 0 refers to node 10000/
    bad_parent = Marshal.load(Marshal.dump(doc))
    bad_parent[:stacks][:nodes][0] = 5
    assert_corrupt JSON.generate(bad_parent), /node 1 has parent 5/
    bad_frame = Marshal.load(Marshal.dump(doc))
    bad_frame[:stacks][:nodes][1] = -1
    assert_corrupt JSON.generate(bad_frame), /node 1 refers to frame -1/
    short = Marshal.load(Marshal.dump(doc))
    short[:stacks][:deltas].pop
    assert_corrupt JSON.generate(short), /sample_deltas has 29 entries for 30 samples/
    wrong_type = Marshal.load(Marshal.dump(doc))
    wrong_type[:stacks][:samples] = "x"
    assert_corrupt JSON.generate(wrong_type), /samples is not an array/
  end

  def test_missing_file
    error = assert_raises(Strobe::ProfileError) { Strobe.load(File.join(@dir, "none.json")) }
    assert_match(/none\.json: No such file or directory/, error.message)
  end
end
