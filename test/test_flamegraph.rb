# frozen_string_literal: true

require "test_helper"
require "json"
require "tmpdir"
require "zlib"
require "stringio"
require "cgi"

# The HTML flamegraph: its data, its escaping, and the page itself loaded in
# headless Chromium (Debian's chromium, installed by .ci/run).
class TestFlamegraph < Minitest::Test
  def profile
    frames = {
      1 => { name: "<main>", file: "/app/main.rb", line: 1 },
      2 => { name: "Render#html </script><!--<script>", file: "/app/view.rb", line: 3 },
      3 => { name: "Db#query", file: "/app/db.rb", line: 9 },
    }
    raw = [2, 1, 2, 30, 2, 1, 3, 50, 2, 1, 2, 20]
    result = { version: 1.2, mode: :wall, interval: 1000, samples: 100, gc_samples: 0, missed_samples: 0,
               frames: frames, raw: raw, raw_lines: raw, raw_sample_threads: [1] * 100,
               threads: { 1 => { name: "main", samples: 100 } } }
    # Raw arrays as stackprof has them (tests below change them); a result of
    # Strobe's own, with its compact form, is drawn in the Chromium tests.
    Strobe.expand(Strobe::Native.thread_subset(result, 1)).tap { |r| r.delete(:thread) }
  end

  def html(result = profile, **options)
    io = StringIO.new
    Strobe::Report.new(result).print_flamegraph(io, **options)
    io.string
  end

  def test_data_is_the_stack_tree_and_the_timeline
    data = Strobe::Flamegraph.new(Strobe::Report.new(profile)).data
    tree = data[:tree]
    assert_equal 100, tree[:total][0]
    assert_equal(-1, tree[:parent][0])
    tree[:parent].each_with_index.drop(1).each { |parent, n| assert_operator parent, :<, n }
    names = tree[:frame].drop(1).map { |f| data[:frames][:name][f] }
    assert_equal ["<main>", "Render#html </script><!--<script>", "Db#query"], names
    assert_equal 100, data[:meta][:samples]
    lane = only(data[:lanes])
    assert_equal [30, 50, 20], lane[:runs][:count]
    assert_equal "samples", data[:axis][:unit], "without sample times the axis counts samples"
    assert_equal [0, 30, 80], lane[:runs][:start]
    assert_equal [30, 80, 100], lane[:runs][:end]
    assert_equal 100, data[:axis][:width]
  end

  # A lane per thread, the main thread first: its runs add up to its
  # samples, on a time axis shared by all; its own self counts add up to
  # the same, and every thread's add up to the tree's.
  def test_a_lane_per_thread_on_one_time_axis
    frames = { 1 => { name: "<main>", file: "a.rb", line: 1 }, 2 => { name: "work", file: "a.rb", line: 2 },
               3 => { name: "wait", file: "a.rb", line: 3 } }
    # Thread 20 starts first, then the main thread (10), then thread 30;
    # raw interleaves them as the sampler records.
    threads = [20, 20, 10, 20, 10, 30, 10, 30]
    stamps = [1000, 2000, 2500, 3000, 3500, 4000, 4500, 5000]
    stacks = [[1, 2], [1, 2], [1], [1, 2], [1, 3], [1, 2], [1, 3], [1]]
    raw = stacks.flat_map { |stack| [stack.size, *stack, 1] }
    result = { version: 1.2, mode: :wall, interval: 1000, samples: 8, gc_samples: 0, missed_samples: 0,
               frames: frames, raw: raw, raw_lines: raw.map { 0 }, raw_sample_threads: threads, raw_sample_timestamps: stamps,
               threads: { 20 => { name: "worker", samples: 3 }, 10 => { name: nil, samples: 3, main: true },
                          30 => { name: nil, samples: 2 } } }
    data = Strobe::Flamegraph.new(Strobe::Report.new(result)).data
    assert_equal [10, 20, 30], data[:lanes].map { |l| l[:thread] }
    assert_equal ["main", "worker", "thread 30"], data[:lanes].map { |l| l[:name] }
    assert_equal [3, 3, 2], data[:lanes].map { |l| l[:samples] }
    assert_equal "us", data[:axis][:unit]
    assert_equal 5000, data[:axis][:width], "from the first sample (1000) to the last one's end (5000 + 1000)"
    data[:lanes].each do |lane|
      assert_equal lane[:samples], lane[:runs][:count].sum
      assert_equal lane[:samples], lane[:self][:count].sum
      lane[:runs][:start].zip(lane[:runs][:end]).each_cons(2) { |(_, e), (s, _)| assert_operator e, :<=, s }
    end
    worker = data[:lanes][1]
    assert_equal [[0], [3], [3000]], worker[:runs].values_at(:start, :count, :end),
                 "its three samples of one stack, a step apart, are one run, the last standing one interval"
    main = data[:lanes][0]
    assert_equal [[1500, 2500], [1, 2], [2500, 4500]], main[:runs].values_at(:start, :count, :end),
                 "a run ends where the thread's next one starts"
    self_total = Hash.new(0)
    data[:lanes].each { |l| l[:self][:node].zip(l[:self][:count]).each { |n, c| self_total[n] += c } }
    data[:tree][:self].each_with_index { |count, n| assert_equal count, self_total[n] }
  end

  # The timeline's runs are bounded (200,000 for all lanes): a profile
  # whose stack changes at every sample is downsampled, each bucket of time
  # drawn with its most sampled run, every sample still counted.
  def test_the_timeline_is_downsampled_past_its_bound
    result = Strobe.run(mode: :custom, raw: true) { 250_000.times { |i| i.even? ? Strobe.sample : [1].each { Strobe.sample } } }
    lane = only(Strobe::Flamegraph.new(Strobe::Report.new(result)).data[:lanes])
    assert_operator lane[:runs][:node].size, :<=, 200_000
    assert_equal 250_000, lane[:runs][:count].sum
    lane[:runs][:start].zip(lane[:runs][:end]).each_cons(2) { |(s0, e0), (s1, _)| assert_operator e0, :<=, s1 if s0 < s1 }
  end

  # Profiles recorded an hour apart, merged: the hour is cut out of the
  # axis, leaving a short break, so both stay readable.
  def test_a_long_stretch_without_samples_is_a_break
    hour = 3_600_000_000
    later = with_markers.merge(raw_sample_timestamps: with_markers[:raw_sample_timestamps].map { |t| t + hour },
                               markers: with_markers[:markers].map { |m| m.merge(start: m[:start] + hour, end: m[:end] && m[:end] + hour) })
    data = Strobe::Flamegraph.new(Strobe::Report.new(Strobe::Merge.results([with_markers, later]))).data
    width = data[:axis][:width]
    assert_operator width, :<, 210_000, "two 100 ms profiles and a break, not an hour"
    assert_operator width, :>, 200_000
    assert_equal 1, data[:axis][:breaks].size
    first, second = only(data[:lanes])[:runs][:start].values_at(0, -1)
    assert_equal 0, first
    assert_operator second, :<, width
    starts = data[:markers][:start]
    assert_equal starts.first(4).map { |s| s + (width - 100_000) }, starts.last(4), "the later markers moved with their samples"
  end

  def test_no_frame_name_can_end_the_script
    page = html(title: "t </title><script>alert(1)</script>")
    script = page[/<script>(.*)<\/script>/m, 1]
    refute_includes script, "</script", "frame names are escaped inside the data"
    refute_includes script, "<!--"
    assert_includes page, "<title>t &lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>"
    assert_equal 1, page.scan("<script").size
  end

  # Names from a profile file may hold any bytes: the page gets them as
  # valid UTF-8 (JSON holds nothing else), what is not replaced.
  def test_names_that_are_not_utf8
    result = profile
    result[:frames][3] = result[:frames][3].merge(name: "Db#\xFF\xFEquery".b, file: "/app/\xC3(.rb".b)
    result[:threads][1] = { name: "w\xE9rker".dup.force_encoding(Encoding::ISO_8859_1), samples: 100 }
    data = Strobe::Flamegraph.new(Strobe::Report.new(result)).data
    assert_includes data[:frames][:name], "Db#\uFFFD\uFFFDquery"
    assert_equal "w\u00E9rker", data[:lanes].first[:name]
    assert_match(/Db#\uFFFD\uFFFDquery/, html(result))
  end

  def test_needs_raw_data
    no_raw = profile.reject { |k, _| k.to_s.start_with?("raw") }
    assert_raises(Strobe::ProfileError) { html(no_raw) }
  end

  # Headless Chromium loads the page offline and draws boxes, in both views
  # and with a search; the screenshot has the flames' warm colours.
  def test_renders_in_headless_chromium
    assert CHROMIUM, "chromium is needed for this test (.ci/run installs Debian's chromium)"
    Dir.mktmpdir do |dir|
      page = File.join(dir, "flame.html")
      File.write(page, html)
      agg = chromium_dom("file://#{page}")
      assert_match(/<body[^>]* data-ready="1"/, agg)
      assert_operator agg[/data-boxes="(\d+)"/, 1].to_i, :>=, 3
      assert_match(/data-view="agg"/, agg)

      timeline = chromium_dom("file://#{page}#view=timeline&search=query")
      assert_match(/data-view="timeline"/, timeline)
      assert_equal "50", timeline[/data-match-samples="(\d+)"/, 1], "Db#query is in 50 samples"

      shot = File.join(dir, "flame.png")
      run_tool(CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,600",
                  "--virtual-time-budget=5000", "--screenshot=#{shot}", "file://#{page}", timeout: 120)
      pixels = png_rgb(File.binread(shot))
      warm = pixels.count { |r, g, b| r > 200 && b < 130 && g < 220 }
      assert_operator warm, :>, 10_000, "the flames are drawn (warm pixels in the screenshot)"
    end
  end

  def with_markers(result = profile)
    result.merge(
      raw_sample_timestamps: (1..100).map { |k| k * 1000 },
      markers: [
        { type: :request, name: "GET /posts", thread: 1, start: 10_500, end: 60_500,
          data: { method: "GET", status: 200, tags: %w[a b], none: nil } },
        { type: :gc, name: "GC", thread: 1, start: 30_000, end: 35_000, data: { phases: %w[marking sweeping] } },
        { type: :user, name: "tick", thread: 1, start: 70_000, end: nil, data: nil },
        { type: :request, name: "GET /again", thread: 1, start: 50_000, end: 80_000, data: nil },
      ]
    )
  end

  # Markers go under their thread's lane at their times on the axis (from
  # the first sample), each with the lines of its tooltip.
  def test_markers_are_placed_on_the_timeline
    lane = Strobe::Flamegraph.new(Strobe::Report.new(with_markers)).data[:markers]
    assert_equal %w[request gc user request], lane[:type]
    assert_equal [9_500, 29_000, 69_000, 49_000], lane[:start], "microseconds after the first sample (1000)"
    assert_equal [59_500, 34_000, nil, 79_000], lane[:end]
    assert_equal [0, 0, 0, 0], lane[:lane]
    assert_equal ["request on main, 50.000 ms", "method: GET", "status: 200", "tags: a, b"], lane[:detail][0]
    assert_equal ["user on main, an instant"], lane[:detail][2]
    assert_nil Strobe::Flamegraph.new(Strobe::Report.new(profile)).data[:markers]
    bad = with_markers.merge(markers: [{ type: :user, name: 1, start: 0 }])
    assert_raises(Strobe::ProfileError) { Strobe::Flamegraph.new(Strobe::Report.new(bad)).data }

    # Two workers' profiles of the same time, merged: each one's markers
    # in its own lane, at the same times.
    other = with_markers.merge(raw_sample_threads: [2] * 100, threads: { 2 => { name: "worker 2", samples: 100 } },
                               markers: with_markers[:markers].map { |m| m.merge(thread: 2) } +
                                        [{ type: :user, name: "elsewhere", thread: 3, start: 5_000, end: nil, data: nil }])
    merged = Strobe::Merge.results([with_markers, other])
    lane = Strobe::Flamegraph.new(Strobe::Report.new(merged)).data[:markers]
    assert_equal [9_500, 29_000, 69_000, 49_000] * 2 + [4_000], lane[:start]
    assert_equal [0, 0, 0, 0, 1, 1, 1, 1, -1], lane[:lane], "a thread without samples has no lane"
    assert_equal "request on worker 2, 50.000 ms", lane[:detail][4].first
  end

  # In Chromium: the lane is drawn under the timeline (overlapping requests
  # in two rows), not in the aggregated view.
  def test_the_marker_lane_renders_under_the_timeline
    assert CHROMIUM, "chromium is needed for this test (.ci/run installs Debian's chromium)"
    Dir.mktmpdir do |dir|
      page = File.join(dir, "flame.html")
      File.write(page, html(with_markers))
      timeline = chromium_dom("file://#{page}#view=timeline")
      assert_match(/<body[^>]* data-ready="1"/, timeline)
      assert_equal "4", timeline[/data-marker-boxes="(\d+)"/, 1]
      assert_equal "0", chromium_dom("file://#{page}")[/data-marker-boxes="(\d+)"/, 1], "none in the aggregated view"

      purple = lambda do |url|
        shot = File.join(dir, "shot.png")
        run_tool(CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,600",
                 "--virtual-time-budget=5000", "--screenshot=#{shot}", url, timeout: 120)
        png_rgb(File.binread(shot)).count { |r, g, b| b > 185 && r.between?(140, 180) && g.between?(105, 145) }
      end
      # The requests' colour: two rows (they overlap), each about half the
      # width of 1000 px and 17 px high.
      assert_operator purple.call("file://#{page}#view=timeline"), :>, 8000
      assert_operator purple.call("file://#{page}"), :<, 100
    end
  end

  # A real profile of four threads (the main one joining three workers):
  # the timeline shows a lane per thread, each under its title band, and
  # the thread picker lists the four; picking one shows its lane alone.
  def test_four_threads_four_lanes_and_a_thread_picker
    assert CHROMIUM, "chromium is needed for this test (.ci/run installs Debian's chromium)"
    go = Queue.new
    workers = 3.times.map { |i| Thread.new { Thread.current.name = "worker #{i}"; go.pop; spin(0.2) } }
    result = Strobe.run(mode: :wall, interval: 1000, raw: true, threads: [Thread.current, *workers]) do
      3.times { go << true }
      workers.each(&:join)
    end
    assert_equal 4, result[:threads].count { |_, t| t[:samples].positive? }, result[:threads].inspect
    Dir.mktmpdir do |dir|
      page = File.join(dir, "flame.html")
      File.write(page, html(result))
      dom = chromium_dom("file://#{page}#view=timeline")
      assert_match(/<body[^>]* data-ready="1"/, dom)
      assert_equal "4", dom[/<body[^>]* data-lanes="(\d+)"/, 1]
      picker = dom[%r{<span id="thread-picker"[^>]*>.*?</span>}m]
      refute_match(/<span id="thread-picker"[^>]* hidden/, picker, "the picker is shown")
      options = picker.scan(%r{<option value="(-?\d+)">([^<]*)</option>})
      assert_equal 5, options.size, picker
      assert_match(/\AAll threads \(4\)/, options.first.last)
      names = options.drop(1).map { |_, text| text[/\A(main|worker \d)/] }
      assert_equal "main", names.first, "the main thread first, then by their first sample"
      assert_equal ["worker 0", "worker 1", "worker 2"], names.drop(1).sort

      assert_equal 4, title_bands(screenshot(dir, "file://#{page}#view=timeline")), "four lanes, each under its title"
      one = "file://#{page}#view=timeline&thread=#{CGI.escape('worker 1')}"
      assert_equal "1", chromium_dom(one)[/<body[^>]* data-lanes="(\d+)"/, 1]
      assert_equal 1, title_bands(screenshot(dir, one))
    end
  end

  # Past a dozen threads, each is a title and one strip of its running
  # frame, so that hundreds stay readable; one picked shows its stacks.
  def test_many_threads_are_strips
    threads = (1..20).to_a
    frames = { 1 => { name: "<main>", file: "a.rb", line: 1 }, 2 => { name: "work", file: "a.rb", line: 2 } }
    raw = threads.flat_map { [2, 1, 2, 3] }
    result = { version: 1.2, mode: :wall, interval: 1000, samples: 60, gc_samples: 0, missed_samples: 0,
               frames: frames, raw: raw, raw_lines: raw.map { 0 }, raw_sample_threads: threads.flat_map { |t| [t] * 3 },
               raw_sample_timestamps: threads.flat_map { |t| [t * 1000, t * 1000 + 1000, t * 1000 + 2000] },
               threads: threads.to_h { |t| [t, { name: "worker #{t}", samples: 3 }] } }
    Dir.mktmpdir do |dir|
      page = File.join(dir, "flame.html")
      File.write(page, html(result))
      all = chromium_dom("file://#{page}#view=timeline")
      assert_equal %w[20 1], [all[/<body[^>]* data-lanes="(\d+)"/, 1], all[/<body[^>]* data-strips="(\d)"/, 1]]
      assert_operator all[/data-boxes="(\d+)"/, 1].to_i, :>=, 20, "a strip drawn per thread"
      one = chromium_dom("file://#{page}#view=timeline&thread=#{CGI.escape('worker 7')}")
      assert_equal %w[1 0], [one[/<body[^>]* data-lanes="(\d+)"/, 1], one[/<body[^>]* data-strips="(\d)"/, 1]]
    end
  end

  private

  def screenshot(dir, url)
    shot = File.join(dir, "shot.png")
    run_tool(CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,1600",
             "--virtual-time-budget=5000", "--screenshot=#{shot}", url, timeout: 120)
    File.binread(shot)
  end

  # How many bands of rows in the screenshot are mostly the timeline's
  # title colour (#dde4ee): one per thread's lane.
  def title_bands(png)
    width, pixels = png_size_and_rgb(png)
    titled = pixels.each_slice(width).map { |row| row.count { |px| px == [0xdd, 0xe4, 0xee] } > width / 2 }
    titled.chunk_while { |a, b| a == b }.count(&:first)
  end

  def only(list)
    assert_equal 1, list.size
    list.first
  end

  # The pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium's
  # screenshots are), as [r, g, b] triples, row by row.
  def png_rgb(bytes)
    png_size_and_rgb(bytes).last
  end

  # [width, pixels] of such a PNG.
  def png_size_and_rgb(bytes)
    raise "not a PNG" unless bytes.start_with?("\x89PNG\r\n\x1a\n".b)

    pos = 8
    idat = +""
    width = height = channels = nil
    while pos < bytes.size
      len = bytes[pos, 4].unpack1("N")
      type = bytes[pos + 4, 4]
      body = bytes[pos + 8, len]
      case type
      when "IHDR"
        width, height, depth, color, _, _, interlace = body.unpack("NNCCCCC")
        raise "unsupported PNG" unless depth == 8 && [2, 6].include?(color) && interlace.zero?

        channels = color == 6 ? 4 : 3
      when "IDAT" then idat << body
      end
      pos += 12 + len
    end
    data = Zlib::Inflate.inflate(idat).bytes
    stride = width * channels
    prev = Array.new(stride, 0)
    pixels = []
    height.times do |y|
      filter = data[y * (stride + 1)]
      line = data[y * (stride + 1) + 1, stride]
      line.each_index do |i|
        a = i >= channels ? line[i - channels] : 0
        b = prev[i]
        c = i >= channels ? prev[i - channels] : 0
        line[i] = (line[i] + case filter
                             when 0 then 0
                             when 1 then a
                             when 2 then b
                             when 3 then (a + b) / 2
                             else paeth(a, b, c)
                             end) & 0xff
      end
      line.each_slice(channels) { |px| pixels << px.first(3) }
      prev = line
    end
    [width, pixels]
  end

  def paeth(a, b, c)
    p = a + b - c
    pa = (p - a).abs
    pb = (p - b).abs
    pc = (p - c).abs
    return a if pa <= pb && pa <= pc

    pb <= pc ? b : c
  end
end
