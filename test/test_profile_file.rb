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

  # The working directory profiling started in (what relative frame paths
  # are relative to) is in the result, the file and merges of results that
  # agree on it.
  def test_the_working_directory_is_kept
    result = Dir.chdir(@dir) { profile }
    assert_equal File.realpath(@dir), result[:cwd]
    path = File.join(@dir, "p.json")
    Strobe.save(result, path)
    assert_equal result[:cwd], Strobe.load(path)[:cwd]
    assert_equal result[:cwd], Strobe::Merge.results([result, result])[:cwd]
    assert_nil Strobe::Merge.results([result, result.merge(cwd: "/elsewhere")])[:cwd]
    doc = Strobe::ProfileFile.encode(result)
    assert_corrupt JSON.generate(doc.merge(cwd: 5)), /cwd is not an absolute path/
    assert_corrupt JSON.generate(doc.merge(cwd: "relative")), /cwd is not an absolute path/
  end

  # Ruby turns transparent huge pages off for its process; `strobe report`
  # turns them back on for its large buffers (a library never does), and a
  # file is read into a buffer that asks for them.
  def test_the_command_line_may_use_huge_pages
    skip "no THP_enabled line in /proc/self/status" unless File.read("/proc/self/status").include?("THP_enabled")

    code = <<~RUBY
      require "strobe"
      thp = -> { File.read("/proc/self/status")[/THP_enabled:\\s*(\\d)/, 1] }
      allowed = Strobe::Native.allow_huge_pages
      buffer = Strobe::ProfileFile.huge_buffer(8 << 20)
      puts [allowed, thp.call, buffer.encoding, buffer.bytesize].join(" ")
    RUBY
    assert_ruby_prints "true 1 ASCII-8BIT 0\n", code
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

  # A Strobe result written as stackprof-layout JSON (`strobe report
  # --json`, JSON.generate of it) loads as Strobe's own files do: the
  # Integer keys JSON turned into strings (threads, a trace's per-thread
  # frames, call_times) come back as Integers, and the exports of its
  # threads work.
  def test_loads_a_strobe_result_saved_as_json
    result = Strobe.run(mode: :custom, raw: true) do
      Thread.new { 2.times { Strobe.sample } }.join
      3.times { Strobe.sample }
    end
    loaded = Strobe::ProfileFile.parse(JSON.generate(result), "s.json")
    assert_equal result[:threads], loaded[:threads]
    assert_equal 2, loaded[:threads].size
    assert_equal result[:raw_sample_threads], loaded[:raw_sample_threads]
    report = Strobe::Report.new(loaded)
    %i[print_flamegraph print_firefox print_speedscope print_pprof].each do |export|
      io = StringIO.new
      report.public_send(export, io)
      assert_operator io.string.bytesize, :>, 0, export
    end
    thread = loaded[:threads].find { |_, info| !info[:main] }.first
    assert_equal 2, Strobe::Report.new(loaded, thread: thread).samples

    trace = Strobe.run(mode: :trace) { Thread.new { Work.run(3) }.join }
    loaded = Strobe::ProfileFile.parse(JSON.generate(trace), "t.json")
    assert_equal trace[:threads], loaded[:threads]
    assert_equal trace[:frames], loaded[:frames]
    assert(loaded[:frames].values.any? { |f| f[:call_times] }, "a frame with call times")
    texts = [trace, loaded].map { |r| StringIO.new.tap { |io| Strobe::Report.new(r).print_text(io) }.string }
    assert_equal texts.first, texts.last

    error = assert_raises(Strobe::ProfileError) do
      Strobe::ProfileFile.parse(JSON.generate(result.merge(threads: { 1 => [] })), "bad.json")
    end
    assert_match(/\Abad\.json: thread 1 is malformed\z/, error.message)
  end

  # A regular file larger than a profile may be is refused unread (this
  # one is sparse: it takes no room).
  def test_a_file_larger_than_a_profile_may_be
    path = File.join(@dir, "huge.json")
    File.open(path, "w") { |file| file.truncate(Strobe::ProfileFile::MAX_INFLATED + 1) }
    error = assert_raises(Strobe::ProfileError) { Strobe.load(path) }
    assert_equal "#{path}: larger than 1024 MB, the most a profile may be", error.message
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
    result = Strobe.expand(profile) # (the raw arrays, not the compact form, are written)
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

  # A Strobe file's samples are read from its text in C (json_columns.c);
  # the rest of it, or a file the scanner does not vouch for, by JSON.parse.
  def test_samples_read_from_the_text_load_as_parsed_ones
    doc = Strobe::ProfileFile.encode(profile(60))
    text = JSON.generate(doc)
    range = Strobe::Native.stacks_range(text)
    refute_nil range
    assert_equal JSON.generate(doc[:stacks]), text.byteslice(range[0]...range[1])
    parsed = Strobe::ProfileFile.send(:decode, JSON.parse(text, symbolize_names: true), "p")
    from_text = Strobe::ProfileFile.parse(text.dup, "p")
    assert_equal Strobe.expand(parsed), Strobe.expand(from_text)
    # Whitespace anywhere, and the keys in another order, read the same.
    pretty = JSON.pretty_generate(doc.merge(stacks: doc[:stacks].to_a.reverse.to_h))
    refute_nil Strobe::Native.stacks_range(pretty)
    assert_equal Strobe.expand(parsed), Strobe.expand(Strobe::ProfileFile.parse(pretty, "p"))
    # What the scanner leaves to JSON.parse: not Strobe's file, a key
    # written with escapes, stacks twice, stacks not an object.
    assert_nil Strobe::Native.stacks_range(JSON.generate(doc.except(:strobe_file)))
    escaped = text.sub('"stacks":', '"st\\u0061cks":')
    assert_nil Strobe::Native.stacks_range(escaped)
    assert_equal Strobe.expand(parsed), Strobe.expand(Strobe::ProfileFile.parse(escaped, "p"))
    assert_nil Strobe::Native.stacks_range(text.sub("{", '{"stacks":{},'))
    assert_nil Strobe::Native.stacks_range(text.sub(/"stacks":\{/, '"stacks":[{').sub(/\}\}\z/, "}]}"))
    assert_nil Strobe::Native.stacks_range(text[0..-2])
    assert_nil Strobe::Native.stacks_range("#{text}x")
  end

  # What a text reads to (its expanded result, or the ProfileError), and
  # what JSON.parse makes of it: the key written with an escape, which the
  # text path leaves to JSON.parse.
  def outcome(text)
    Strobe.expand(Strobe::ProfileFile.parse(text.dup, "p"))
  rescue Strobe::ProfileError => e
    e.message
  end

  def assert_read_as_json_parse_reads(text, via_text: nil)
    parsed = text.sub('"stacks":', '"st\\u0061cks":')
    refute_equal text, parsed
    assert_nil Strobe::Native.stacks_range(parsed)
    assert_equal via_text, !Strobe::Native.stacks_range(text).nil?, text[-300..] unless via_text.nil?
    assert_equal outcome(parsed), outcome(text), text[-300..]
  end

  # The review's: a stacks section that is an Array is no text range, and
  # a profile read as UTF-8 (File.read) is not taken for gzip by its bytes.
  def test_a_stacks_array_is_malformed_and_any_encoding_reads
    doc = Strobe::ProfileFile.encode(profile)
    fake = JSON.generate(doc.merge(stacks: ["{\"nodes\":[0,0,1],\"samples\":[1,1,1]}", 0, 36]))
    assert_corrupt fake, %r{/bad.json: stacks is not an object\z}
    assert_corrupt JSON.generate(doc.merge(stacks: ["x", 0, 10**20])), %r{/bad.json: stacks is not an object\z}
    path = File.join(@dir, "utf8.json")
    doc[:frames].first[:name] = "caf\u00e9 \u2603"
    File.write(path, JSON.generate(doc))
    utf8 = File.read(path, encoding: "UTF-8")
    assert_equal Strobe.expand(Strobe.load(path)), Strobe.expand(Strobe::ProfileFile.parse(utf8, "p"))
  end

  def test_columns_read_from_the_text_read_as_json_parse_reads_them
    doc = Strobe::ProfileFile.encode(profile)
    text = JSON.generate(doc)
    samples = JSON.generate(doc[:stacks][:samples])
    deltas = JSON.generate(doc[:stacks][:deltas])
    column = ->(value) { text.sub("\"samples\":#{samples}", "\"samples\":#{value}") }
    first = doc[:stacks][:samples].first
    rest = doc[:stacks][:samples].drop(1).join(",")
    # Read from the text: integers, however large a Fixnum may be.
    assert_read_as_json_parse_reads text, via_text: true
    assert_read_as_json_parse_reads column.call("[#{first},#{2**62 - 1}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[#{first},#{2**62}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[#{first},-#{2**62}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[#{first},-#{2**62 + 1}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[#{first},#{'9' * 25}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[-1,#{rest}]"), via_text: true
    assert_read_as_json_parse_reads column.call("[-0,#{rest}]"), via_text: true
    assert_read_as_json_parse_reads column.call("null"), via_text: true
    assert_read_as_json_parse_reads text.sub("\"deltas\":#{deltas}", '"deltas":null'), via_text: true
    assert_read_as_json_parse_reads text.sub(/"start_time":\d+/, "\"start_time\":#{2**62 - 1}"), via_text: true
    assert_read_as_json_parse_reads text.sub(/"start_time":\d+/, '"start_time":null'), via_text: true
    # Left to JSON.parse: whatever Strobe does not write there.
    ["[#{first}.0,#{rest}]", "[#{first}e0,#{rest}]", "[#{first},\"2\"]", "[#{first},[2]]", "[01,#{rest}]",
     "[#{first},,#{rest}]", "[#{first} #{rest}]", "{}", "false", "[#{first},/*c*/#{rest}]", "[#{first},tru]"].each do |value|
      assert_read_as_json_parse_reads column.call(value), via_text: false
    end
    [text.sub("\"deltas\":#{deltas}", '"deltas":false'),
     text.sub(/"start_time":\d+/, '"start_time":1.5'),
     text.sub(/"start_time":\d+/, '"start_time":false'),
     text.sub('"stacks":{', '"stacks":{"deltas":"x",'),
     text.sub('"stacks":{', '"stacks":{"later":{"a":[1,{"b":"}]"}]},'),
     text.sub(/"start_time"/, '"st\\u0061rt_time"'),
     text.sub('"stacks":{', '"stacks":{"x":1/*,"samples":[1],"y":2*/,'),
     text.sub('"stacks":{', '"stacks":{"x":1//,"samples":[1]\n,')].each do |variant|
      assert_read_as_json_parse_reads variant, via_text: false
    end
    # A comment or bare word anywhere the scan passes gives the text up.
    assert_nil Strobe::Native.stacks_range(text.sub('"mode":', '/* c */"mode":'))
    assert_nil Strobe::Native.stacks_range(text.sub(/"samples":(\d+)/, '"samples":\1/*,"stacks":{}*/'))
    assert_nil Strobe::Native.stacks_range(text.sub(/"samples":(\d+)/, '"samples":NaN'))
  end

  # --- saving safely (issue 18) ---

  # A file of root's that a planted symlink points to, as in the report:
  # [its path, its contents].
  def victim
    path = File.join(@dir, "victim")
    File.write(path, "root's secret")
    File.chmod(0o600, path)
    [path, "root's secret"]
  end

  def assert_victim_intact(path, contents)
    assert_equal contents, File.read(path)
    assert_equal 0o600, File.stat(path).mode & 0o777
  end

  # Someone who can write the directory plants symlinks where a save might
  # put its temporary file: Strobe.save, results' out: and an export write
  # the profile, never through the symlink, and leave the symlink alone.
  def test_saves_do_not_follow_planted_symlinks
    target, secret = victim
    result = profile
    path = File.join(@dir, "p.json")
    planted = ["#{path}.#{Process.pid}.tmp", "#{path}.tmp", File.join(@dir, ".p.json.tmp")]
    planted.each { |link| File.symlink(target, link) }
    Strobe.save(result, path)
    assert_victim_intact(target, secret)
    assert_equal result, Strobe.load(path)
    profile(out: path)
    assert_victim_intact(target, secret)
    assert_equal 30, Strobe.load(path)[:samples]
    Strobe.save(result, path, format: :speedscope)
    assert_victim_intact(target, secret)
    assert_match(/speedscope/, File.read(path))
    assert(planted.all? { |link| File.symlink?(link) }, "the planted symlinks are someone else's: left alone")
    assert_equal [path, target, *planted].sort, Dir.glob(File.join(@dir, "*"), File::FNM_DOTMATCH).reject { |f| f.end_with?("/.") }.sort
  end

  # The target itself a symlink: the save replaces the link, as a rename
  # does, and does not write where it points.
  def test_a_symlink_at_the_target_is_replaced_not_followed
    target, secret = victim
    path = File.join(@dir, "p.json")
    File.symlink(target, path)
    Strobe.save(profile, path)
    assert_victim_intact(target, secret)
    refute File.symlink?(path)
    assert_equal 30, Strobe.load(path)[:samples]
  end

  # A FIFO, a device or a socket at the target is written in place: a
  # rename would put a regular file where the device was (as root, over
  # /dev/null or /dev/stdout itself). Through a symlink too, unless the
  # link is in a directory anyone may write to, where it may be planted.
  def test_devices_and_fifos_are_written_in_place
    fifo = File.join(@dir, "fifo")
    File.mkfifo(fifo)
    data = read_fifo(fifo) { Strobe.save(profile, fifo) }
    assert File.pipe?(fifo), "still a FIFO"
    assert_equal 30, Strobe::ProfileFile.parse(data, fifo)[:samples]

    # /dev/null through a link in a private directory (were the link
    # replaced, /dev/null itself would be safe).
    null = File.join(@dir, "null")
    File.symlink("/dev/null", null)
    Strobe.save(profile, null)
    assert File.symlink?(null), "the link is kept: /dev/null was written through it"
    assert File.chardev?("/dev/null")

    shared = File.join(@dir, "shared")
    Dir.mkdir(shared)
    File.chmod(0o1777, shared)
    planted = File.join(shared, "p.json")
    File.symlink(null, planted)
    Strobe.save(profile, planted)
    refute File.symlink?(planted), "a link anyone could have planted is replaced, not followed"
    assert_equal 30, Strobe.load(planted)[:samples]
  end

  # What the block writes to the FIFO at path, read by this process: its
  # read end is open before the block runs (a writer that does not wait for
  # a reader finds one), and a write end of its own keeps it from ending
  # before the block is done.
  def read_fifo(path)
    File.open(path, File::RDONLY | File::NONBLOCK) do |fifo|
      keep = File.open(path, File::WRONLY)
      reader = Thread.new { fifo.read }
      begin
        yield
      ensure
        keep.close
      end
      reader.value
    end
  end

  # Runs the block in a forked child: [:returned, its value] or [:raised,
  # the error's class name, its message], or [:blocked] when it has not
  # ended after `seconds` (the child is then killed). For writes that could
  # wait for good on today's code.
  def in_child(seconds = 10)
    rd, wr = IO.pipe
    pid = fork do
      rd.close
      outcome = begin
        [:returned, yield]
      rescue StandardError => e
        [:raised, e.class.name, e.message]
      end
      wr.write(Marshal.dump(outcome))
      exit!(0)
    end
    wr.close
    return [:blocked] unless IO.select([rd], nil, nil, seconds)

    Marshal.load(rd.read) # rubocop:disable Security/MarshalLoad (our own child's)
  ensure
    rd&.close
    if pid && !Process.wait(pid, Process::WNOHANG)
      Process.kill(:KILL, pid) # (blocked, or about to exit)
      Process.wait(pid)
    end
  end

  # A FIFO nobody reads is an error at once: the open does not wait for a
  # reader (before, the save waited in open(2) for good).
  def test_a_fifo_nobody_reads_is_an_error_not_a_wait
    fifo = File.join(@dir, "fifo")
    File.mkfifo(fifo)
    result = profile
    outcome = in_child { Strobe.save(result, fifo) }
    assert_equal :raised, outcome[0], "the save #{outcome[0]}"
    assert_equal "Strobe::AtomicFile::Unread", outcome[1]
    assert_match(/#{Regexp.escape(fifo)}: a FIFO that no process is reading/, outcome[2])
    assert File.pipe?(fifo), "left as it was"
  end

  # A directory anyone may write to, sticky as /tmp is, with a FIFO and a
  # device in it that another user (nobody, uid 65534) put there.
  def planted_specials
    shared = File.join(@dir, "shared")
    Dir.mkdir(shared)
    File.chmod(0o1777, shared)
    fifo = File.join(shared, "p.json")
    File.mkfifo(fifo)
    device = File.join(shared, "d.json")
    system("mknod", device, "c", "1", "3", exception: true) # /dev/null's numbers
    [fifo, device].each { |path| File.chown(65_534, 65_534, path) }
    [shared, fifo, device]
  end

  # A FIFO or device another user planted in a shared directory (/tmp, a
  # STROBE_OUT_DIR anyone may write to) is refused with one line, before it
  # is opened: the save neither waits for a reader nor hands the profile
  # to one (before, it did one or the other).
  def test_a_special_file_planted_by_another_user_is_refused
    skip "needs root, to give the files to another user" unless Process.euid.zero?

    _, fifo, device = planted_specials
    result = profile
    [fifo, device].each do |path|
      outcome = in_child { Strobe.save(result, path) }
      assert_equal :raised, outcome[0], "the save to #{path} #{outcome[0]}"
      assert_equal "Strobe::AtomicFile::Refused", outcome[1]
      kind = path == fifo ? "FIFO" : "character device"
      assert_equal "Operation not permitted - #{path}: a #{kind} of uid 65534's, neither this process's user " \
                   "nor root: not written (another user may have put it there)", outcome[2]
    end
    # The planter reading: nothing reaches it.
    read = read_fifo(fifo) { assert_equal :raised, in_child { Strobe.save(result, fifo) }[0] }
    assert_equal "", read
    # Reached through a symlink of the operator's own: refused all the same.
    link = File.join(@dir, "link.json")
    File.symlink(fifo, link)
    assert_raises(Strobe::AtomicFile::Refused) { Strobe.save(result, link) }
    # One's own FIFO there is written.
    File.chown(Process.euid, Process.egid, fifo)
    assert_equal 30, Strobe::ProfileFile.parse(read_fifo(fifo) { Strobe.save(result, fifo) }, fifo)[:samples]
    assert File.pipe?(fifo)
  end

  # The callers say so in one line: `strobe report -o` (exit status 1),
  # and the save at exit of a process whose STROBE_OUT_DIR, shared, holds a
  # FIFO of another user's at its predictable name (PID.json); neither waits.
  def test_callers_refuse_a_planted_fifo_in_one_line
    skip "needs root, to give the files to another user" unless Process.euid.zero?

    require "strobe/cli"
    shared, fifo, = planted_specials
    saved = File.join(@dir, "p.json")
    Strobe.save(profile, saved)
    err = StringIO.new
    outcome = in_child { [Strobe::CLI.new(["report", saved, "-o", fifo], out: StringIO.new, err: err).run, err.string] }
    assert_equal [:returned, [1, "strobe: cannot write #{fifo}: a FIFO of uid 65534's, neither this process's " \
                                 "user nor root: not written (another user may have put it there)\n"]], outcome

    plant = "path = File.join(ENV['STROBE_OUT_DIR'], \"\#{Process.pid}.json\"); File.mkfifo(path); " \
            "File.chown(65534, 65534, path)"
    _, err, status = run_ruby(plant, env: { "RUBYOPT" => "-rstrobe/autorun", "STROBE_OUT_DIR" => shared })
    assert status.success?, err
    lines = err.lines.grep(/could not write/)
    assert_equal 1, lines.size, err
    assert_match(%r{\Astrobe: could not write the profile to #{Regexp.escape(shared)}/\d+\.json: a FIFO of uid 65534's, },
                 lines[0])
  end

  # A directory of another user's (nobody's 0755 STROBE_OUT_DIR, made
  # before the process started) is theirs to fill: a FIFO they put there,
  # opened for reading and never read, is refused at once, and nothing
  # reaches it (before, the directory was trusted as not world-writable and
  # the save waited for good once the pipe was full).
  def test_a_fifo_in_a_directory_of_another_users_is_refused
    skip "needs root, to give the directory to another user" unless Process.euid.zero?

    theirs = File.join(@dir, "theirs")
    Dir.mkdir(theirs, 0o755)
    File.chown(65_534, 65_534, theirs)
    fifo = File.join(theirs, "#{Process.pid}.json")
    File.mkfifo(fifo, 0o600)
    File.chown(65_534, 65_534, fifo)
    File.open(fifo, File::RDONLY | File::NONBLOCK) do |reader| # never reads
      outcome = in_child { Strobe::AtomicFile.write(fifo) { |io| io.write("p" * (1 << 20)) } }
      assert_equal [:raised, "Strobe::AtomicFile::Refused",
                    "Operation not permitted - #{fifo}: a FIFO of uid 65534's, neither this process's user nor root: " \
                    "not written (another user may have put it there)"], outcome
      assert_nil reader.read_nonblock(1, exception: false), "nothing written (EOF: no writer left)"
    end
    assert File.pipe?(fifo), "left as it was"
  end

  # A symlink on the way to the target's directory is followed only where
  # nobody else can have put it: not in a world-writable directory without
  # the sticky bit (anyone may replace it), nor another user's link in a
  # sticky one (/tmp), nor in another user's directory; the save is refused
  # and nothing lands where the link leads. One's own in a sticky directory
  # and any in a trusted one are followed. (Before, the directory part was
  # opened by path, following every link: another user chose where root's
  # profile went, third review.)
  def test_symlinks_on_the_way_to_the_directory
    elsewhere = File.join(@dir, "elsewhere")
    Dir.mkdir(elsewhere, 0o700)
    open = File.join(@dir, "open")
    Dir.mkdir(open)
    File.chmod(0o777, open)
    File.symlink(elsewhere, File.join(open, "sub"))
    error = assert_raises(Strobe::AtomicFile::Refused) { Strobe.save(profile, File.join(open, "sub", "p.json")) }
    assert_match(/sub is a symlink of uid #{Process.euid}'s in a directory other users may change \(mode 777\): not followed/,
                 error.message)
    assert_empty Dir.children(elsewhere)

    File.chmod(0o1777, open) # sticky: one's own link stays one's own
    Strobe.save(profile, File.join(open, "sub", "p.json"))
    assert_equal ["p.json"], Dir.children(elsewhere)
    File.symlink(File.join("..", "open"), File.join(elsewhere, "back")) # trusted: followed, relative
    Strobe.save(profile, File.join(elsewhere, "back", "q.json"))
    assert_equal 30, Strobe.load(File.join(open, "q.json"))[:samples]
    return unless Process.euid.zero?

    theirs = File.join(@dir, "theirs")
    Dir.mkdir(theirs, 0o755)
    File.symlink(elsewhere, File.join(theirs, "sub"))
    File.lchown(65_534, 65_534, File.join(open, "sub"))
    File.chown(65_534, 65_534, theirs)
    [File.join(open, "sub", "r.json"), File.join(theirs, "sub", "r.json")].each do |path|
      assert_raises(Strobe::AtomicFile::Refused, path) { Strobe.save(profile, path) }
    end
    assert_equal %w[back p.json], Dir.children(elsewhere).sort
  end

  # A directory of root's that a group may write to (Debian's /var/local,
  # /var/log) is no safer than /tmp: a member's symlink there to a FIFO or
  # device of root's is replaced, not followed. Before, it was followed and
  # root's FIFO, in a directory only root can enter, got the profile.
  def test_a_symlink_in_a_directory_a_group_may_write_is_not_followed
    skip "needs root, to give the directory's group to another user" unless Process.euid.zero?

    shared = File.join(@dir, "group")
    Dir.mkdir(shared)
    File.chown(0, 65_534, shared)
    File.chmod(0o775, shared)
    fifo = File.join(@dir, "root-only", "fifo")
    Dir.mkdir(File.dirname(fifo), 0o700)
    File.mkfifo(fifo, 0o600)
    target = File.join(shared, "p.json")
    File.symlink(fifo, target)
    File.lchown(65_534, 65_534, target)
    File.open(fifo, File::RDONLY | File::NONBLOCK) do |reader|
      Strobe::AtomicFile.write(target) { |io| io.write("profile") }
      assert_nil reader.read_nonblock(10, exception: false), "nothing reached root's FIFO"
    end
    assert File.file?(target) && !File.symlink?(target), "the symlink was replaced by the file"
  end

  # Another user swaps a directory on the path (their own, holding a symlink
  # to a FIFO of root's, and one of root's) while saves run: the directory
  # is judged and the target opened through one descriptor, so no profile
  # reaches the FIFO (before, hundreds of bytes did in a few thousand saves).
  def test_a_directory_swapped_under_a_save_never_leads_it_to_a_fifo
    skip "needs root, to run another user's process" unless Process.euid.zero?

    File.chmod(0o755, @dir)
    theirs = File.join(@dir, "theirs")
    Dir.mkdir(theirs, 0o755)
    File.chown(65_534, 65_534, theirs)
    trusted = File.join(@dir, "trusted")
    Dir.mkdir(trusted, 0o755)
    fifo = File.join(@dir, "root-only", "fifo")
    Dir.mkdir(File.dirname(fifo), 0o700)
    File.mkfifo(fifo, 0o600)
    attacker = fork do
      Process::GID.change_privilege(65_534)
      Process::UID.change_privilege(65_534)
      decoy = File.join(theirs, "decoy")
      Dir.mkdir(decoy)
      File.symlink(fifo, File.join(decoy, "p.json"))
      link = File.join(theirs, "link")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        [trusted, decoy].each do |to|
          File.symlink(to, "#{link}.new")
          File.rename("#{link}.new", link)
        rescue SystemCallError
          nil
        end
      end
      exit!(0)
    end
    got = +""
    File.open(fifo, File::RDWR) do |reader| # a reader, so that a write would not fail
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 4
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        begin
          Strobe::AtomicFile.write(File.join(theirs, "link", "p.json")) { |io| io.write("profile") }
        rescue SystemCallError
          nil
        end
        got << (reader.read_nonblock(4096, exception: false).then { |r| r.is_a?(String) ? r : "" })
      end
    end
    assert_equal "", got, "profiles reached root's FIFO through the swapped directory"
  ensure
    if attacker
      Process.kill(:KILL, attacker)
      Process.wait(attacker)
    end
  end

  # Every spelling of a held descriptor is one: /dev//stdout, //dev/stdout
  # and /dev/../dev/stdout were renamed over as root.
  def test_spellings_of_a_held_descriptor
    ["/dev/stdout", "/dev//stdout", "/dev/./stdout", "//dev/stdout", "/dev/../dev/stdout", "/proc/self/fd/1"].each do |name|
      io = Strobe::AtomicFile.held(name)
      refute_nil io, name
      io.close
    end
    assert_nil Strobe::AtomicFile.held("/dev/stdout2")
  end

  # Another user flips the target, in a sticky directory anyone can write
  # to, between a hard link to its own FIFO (kept in a directory of its
  # own) and a symlink to it, while saves run: whatever the path shows from
  # one look-up to the next, the descriptor the save opens decides, and no
  # profile reaches the FIFO (before, 1 save in 6 or so was written into it).
  def test_a_target_flipped_between_link_and_symlink_never_reaches_a_fifo
    skip "needs root, to run another user's process" unless Process.euid.zero?

    File.chmod(0o755, @dir)
    shared = File.join(@dir, "shared")
    Dir.mkdir(shared)
    File.chmod(0o1777, shared)
    own = File.join(@dir, "own")
    Dir.mkdir(own, 0o755)
    File.chown(65_534, 65_534, own)
    rounds = 200
    go_rd, go_wr = IO.pipe
    told_rd, told_wr = IO.pipe
    attacker = fork do
      go_wr.close
      told_rd.close
      Process::GID.change_privilege(65_534)
      Process::UID.change_privilege(65_534)
      fifo = File.join(own, "fifo")
      File.mkfifo(fifo, 0o666)
      read = 0
      Thread.new { loop { File.open(fifo) { |f| read += 1 unless f.read.empty? } } }
      rounds.times do |i|
        break unless go_rd.read(1) # the saves are over

        target = File.join(shared, "p#{i}.json")
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.05
        flips = 0
        while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
          planted = File.join(shared, ".planted#{flips += 1}")
          flips.odd? ? File.link(fifo, planted) : File.symlink(fifo, planted)
          begin
            File.rename(planted, target)
          rescue SystemCallError # the save's file, root's, took its place
            File.unlink(planted)
            break
          end
        end
      end
      sleep 0.2 # the last save's data, if any, read
      told_wr.write(read.to_s)
      exit!(0)
    end
    go_rd.close
    told_wr.close
    rounds.times do |i|
      go_wr.write("g")
      sleep(0.005 + rand * 0.03)
      begin
        Strobe::AtomicFile.write(File.join(shared, "p#{i}.json")) { |io| io.write("profile #{i}\n" * 100) }
      rescue Strobe::AtomicFile::Refused, Strobe::AtomicFile::Unread
        nil # the attacker's FIFO, seen on the descriptor
      end
    end
    go_wr.close
    assert_equal "0", told_rd.read, "profiles read out of the attacker's FIFO"
  ensure
    told_rd&.close
    go_wr&.close
    if attacker && !Process.wait(attacker, Process::WNOHANG)
      Process.kill(:KILL, attacker)
      Process.wait(attacker)
    end
  end

  # What an operator writes to on purpose still works: /dev/null, and a
  # pipe of the process's own by its /dev/fd name.
  def test_devices_and_pipes_of_ones_own
    result = profile
    assert_equal "/dev/null", Strobe.save(result, "/dev/null")
    assert File.chardev?("/dev/null")
    IO.pipe do |rd, wr|
      reader = Thread.new { rd.read }
      Strobe.save(result, "/dev/fd/#{wr.fileno}")
      wr.close
      assert_equal 30, Strobe::ProfileFile.parse(reader.value, "pipe")[:samples]
    end
  end

  # A descriptor the process holds is the operator's to hand over: written
  # through, sharing its offset, whoever owns what it reaches (a user's
  # pipe under sudo) and whatever it is. Before, /dev/stdout redirected to
  # a regular file was renamed over (as root: the system's /dev/stdout
  # replaced by a file), and another user's pipe held as /dev/fd/N refused.
  def test_descriptors_the_process_holds_are_written_through
    out = File.join(@dir, "out.txt")
    code = <<~RUBY
      $stdout.reopen(#{out.inspect}, "w")
      print "before "
      Strobe::AtomicFile.write("/dev/stdout") { |io| io.write("PROFILE ") }
      print "after"
    RUBY
    _, err, status = run_ruby("require 'strobe'\n#{code}")
    assert status.success?, err
    assert_equal "before PROFILE after", File.read(out)
    assert File.symlink?("/dev/stdout"), "/dev/stdout is still the system's symlink"
    skip "not root: cannot give a pipe to another user" unless Process.euid.zero?

    IO.pipe do |rd, wr|
      File.chown(65_534, 65_534, "/proc/self/fd/#{wr.fileno}")
      assert_equal 65_534, File.stat("/proc/self/fd/#{wr.fileno}").uid
      Strobe::AtomicFile.write("/dev/fd/#{wr.fileno}") { |io| io.write("theirs") }
      wr.close
      assert_equal "theirs", rd.read
    end
  ensure
    # A regression must not leave the machine without its /dev/stdout.
    if Process.euid.zero? && !File.symlink?("/dev/stdout")
      File.unlink("/dev/stdout")
      File.symlink("/proc/self/fd/1", "/dev/stdout")
    end
  end

  # Replaces AtomicFile.temp_name for the block with one returning the
  # names of paths in turn.
  def with_temp_names(paths)
    original = Strobe::AtomicFile.method(:temp_name)
    queue = paths.map { |path| File.basename(path) }
    Strobe::AtomicFile.define_singleton_method(:temp_name) { |name| queue.shift || original.call(name) }
    yield
  ensure
    Strobe::AtomicFile.define_singleton_method(:temp_name, original)
  end

  # Even a temporary name guessed right finds the file created exclusively:
  # another name is taken, and the planted one left alone.
  def test_temporary_files_are_created_exclusively_without_following_symlinks
    target, secret = victim
    path = File.join(@dir, "p.json")
    guessed = [File.join(@dir, ".p.json.strobe-guessed.tmp"), File.join(@dir, ".p.json.strobe-file.tmp")]
    File.symlink(target, guessed[0])
    File.write(guessed[1], "someone's")
    with_temp_names(guessed) { Strobe.save(profile, path) }
    assert_victim_intact(target, secret)
    assert File.symlink?(guessed[0])
    assert_equal "someone's", File.read(guessed[1])
    assert_equal 30, Strobe.load(path)[:samples]
    # Every name taken: an error, and nothing written.
    File.write(path, "old")
    taken = Array.new(Strobe::AtomicFile::ATTEMPTS) { guessed[0] }
    error = assert_raises(Errno::EEXIST) { with_temp_names(taken) { Strobe.save(profile, path) } }
    assert_match(/temporary names were all taken/, error.message)
    assert_equal "old", File.read(path)
    assert_victim_intact(target, secret)
  end

  # Temporary names are random, in the target's directory, and hidden.
  def test_temporary_names
    names = Array.new(3) { Strobe::AtomicFile.temp_name("p.json") }
    assert_equal 3, names.uniq.size
    names.each { |name| assert_match(/\A\.p\.json\.strobe-\h{32}\.tmp\z/, name) }
    long = Strobe::AtomicFile.temp_name("x" * 250)
    assert_operator long.bytesize, :<=, 255
  end

  # A saved file is its owner's only, while written and after (a profile
  # holds request paths and query shapes), whatever the umask, unless
  # STROBE_FILE_MODE widens it (less the umask; the owner keeps rw); a
  # value that is not octal bits says so once and keeps 0600.
  def test_modes
    path = File.join(@dir, "p.json")
    previous = File.umask
    [[nil, 0o022, 0o600], [nil, 0o000, 0o600], ["640", 0o022, 0o640], ["0644", 0o027, 0o640], ["444", 0o022, 0o644],
     ["777", 0o002, 0o775]].each do |setting, umask, expected|
      File.umask(umask)
      ENV["STROBE_FILE_MODE"] = setting
      modes = []
      Strobe::AtomicFile.write(path) { |io| modes << (io.stat.mode & 0o777) }
      modes << (File.stat(path).mode & 0o777)
      assert_equal [0o600, expected], modes, format("STROBE_FILE_MODE=%s, umask %03o", setting.inspect, umask)
    end
    ENV["STROBE_FILE_MODE"] = "rw-r-----"
    _, err = capture_io do
      2.times { Strobe::AtomicFile.write(path) { |io| io.write("x") } }
    end
    assert_equal 0o600, File.stat(path).mode & 0o777
    assert_equal 1, err.lines.grep(/STROBE_FILE_MODE must be octal permission bits/).size, err
  ensure
    ENV.delete("STROBE_FILE_MODE")
    File.umask(previous)
  end

  # A save that fails, whatever the reason, leaves the target as it was and
  # no temporary file.
  def test_failed_saves_leave_the_target_and_no_temporary_file
    path = File.join(@dir, "p.json")
    File.write(path, "old")
    bad = Strobe.expand(profile)
    bad[:raw] = bad[:raw].dup
    bad[:raw][1] = 123_456_789
    assert_raises(Strobe::ProfileError) { Strobe.save(bad, path) }
    assert_raises(Interrupt) { Strobe::AtomicFile.write(path) { |io| io.write("partial") && raise(Interrupt) } }
    assert_raises(Errno::ENOENT) { Strobe.save(profile, File.join(@dir, "no", "dir", "p.json")) }
    assert_raises(Errno::EISDIR) { Strobe.save(profile, @dir) }
    assert_equal "old", File.read(path)
    assert_equal ["p.json"], Dir.children(@dir)
  end

  # Threads saving different results to one path: every save succeeds (each
  # has its own temporary file), and the file, read at any time, is one of
  # them whole. Bounded by rounds, and by a deadline in case saves are slow.
  def test_threads_saving_to_one_path
    path = File.join(@dir, "p.json")
    results = Array.new(4) { |i| profile(200 + 100 * i, metadata: { writer: i }) }
    Strobe.save(results[0], path)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
    errors = Queue.new
    writers = results.map do |result|
      Thread.new do
        40.times do
          break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

          Strobe.save(result, path, format: :json)
        rescue StandardError => e
          errors << e
        end
      end
    end
    reads = 0
    while writers.any?(&:alive?) && reads < 2000
      loaded = Strobe.load(path)
      assert results.include?(loaded), "a reader saw a file that is none of the saved results"
      reads += 1
    end
    writers.each(&:join)
    assert errors.empty?, "saves failed: #{Array.new(errors.size) { errors.pop.inspect }.uniq.join(', ')}"
    assert results.include?(Strobe.load(path)), "the file is none of the saved results"
    assert_equal ["p.json"], Dir.children(@dir)
  end

  def test_missing_file
    error = assert_raises(Strobe::ProfileError) { Strobe.load(File.join(@dir, "none.json")) }
    assert_match(/none\.json: No such file or directory/, error.message)
  end
end
