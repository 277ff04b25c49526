# frozen_string_literal: true

require "test_helper"
require "stackprof"

# The same deterministic program under the real stackprof gem and under
# Strobe must give results of the same shape and the same counts.
class TestStackprofCompat < Minitest::Test
  module Program
    module_function

    def a(sampler, n)
      n.times { |i| i.even? ? b(sampler) : c(sampler) }
    end

    def b(sampler)
      [1, 2].each { c(sampler) }
    end

    def c(sampler)
      sampler.call
    end
  end

  WORKLOAD = ["TestStackprofCompat::Program.a", "TestStackprofCompat::Program.b",
              "TestStackprofCompat::Program.c", "Integer#times", "Array#each", "LEAF"].freeze

  def setup
    @strobe = Strobe.run(mode: :custom, raw: true) { Program.a(-> { Strobe.sample }, 7) }
    @stackprof = StackProf.run(mode: :custom, raw: true) { Program.a(-> { StackProf.sample }, 7) }
  end

  # {name => frame} with the leaf renamed and edges keyed by callee name,
  # restricted to frames of the workload itself.
  def comparable(result, leaf)
    name = ->(id) { result[:frames][id][:name].sub(leaf, "LEAF") }
    frames = result[:frames].to_h do |id, f|
      f = f.merge(name: name.call(id))
      f[:edges] = f[:edges].transform_keys(&name) if f[:edges]
      [f[:name], f.except(:file, :line)]
    end
    frames.slice(*WORKLOAD)
  end

  # Every stackprof key is there; the raw arrays are built from the
  # compact form (:stacks) as they are first read (Strobe::Stacks::RAW),
  # or all at once by Strobe.expand, which leaves :stacks out.
  def test_top_level_keys_are_stackprofs_plus_extensions
    refute @strobe.key?(:raw), "not built until read"
    expanded = Strobe.expand(@strobe)
    assert_empty @stackprof.keys - expanded.keys, "every stackprof key is present"
    assert_equal %i[threads raw_sample_threads truncated_samples started_at duration pid cwd].sort, (expanded.keys - @stackprof.keys).sort
    assert_equal expanded[:raw], @strobe[:raw]
    assert @strobe.key?(:raw), "built as read"
    assert_kind_of Strobe::Stacks, @strobe[:stacks]
  end

  def test_counts_edges_and_lines_match_stackprof
    ours = comparable(@strobe, "Strobe.sample")
    theirs = comparable(@stackprof, "StackProf.sample")
    assert_equal WORKLOAD.sort, ours.keys.sort
    WORKLOAD.each do |frame|
      assert_equal theirs[frame], ours[frame], "frame #{frame}"
    end
  end

  def test_header_counts_match
    %i[version mode samples gc_samples missed_samples].each do |key|
      assert_equal @stackprof[key], @strobe[key], key.to_s
    end
    assert_nil @strobe[:interval], "custom mode has no interval, as in stackprof"
    assert_nil @stackprof[:interval]
  end

  def test_raw_has_the_same_structure
    assert_equal @stackprof[:raw_sample_timestamps].size, @strobe[:raw_sample_timestamps].size
    assert_equal @stackprof[:raw].size, @strobe[:raw].size
    # Repeat counts sit at the same positions.
    assert_equal @stackprof[:raw_lines].values_at(0, @stackprof[:raw_lines][0] + 1),
                 @strobe[:raw_lines].values_at(0, @strobe[:raw_lines][0] + 1)
  end

  def test_stackprof_report_reads_our_result
    report = StackProf::Report.new(@strobe)
    out = StringIO.new
    report.print_text(false, nil, nil, nil, nil, nil, out)
    assert_match(/Mode: custom/, out.string)
    assert_match(/Strobe\.sample/, out.string)
    assert_equal 11, report.overall_samples
  end
end
