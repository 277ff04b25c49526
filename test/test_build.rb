# frozen_string_literal: true

require_relative "test_helper"
require "fileutils"

# How Strobe is built on the Rubies it supports.
class TestBuild < Minitest::Test
  # Ruby 4.1 removes the postponed-job functions Ruby 3.1 and 3.2 need
  # (rb_postponed_job_register, _one). Where the newer API exists, the
  # extension builds with the old names poisoned, so no path uses them.
  def test_builds_without_the_old_postponed_job_api
    skip "rb_postponed_job_preregister is Ruby 3.3+" if RUBY_VERSION < "3.3"
    dir = File.join(BUILD, "modern_api")
    FileUtils.rm_rf(dir)
    FileUtils.mkdir_p(dir)
    env = { "STROBE_MODERN_API_ONLY" => "1", "LD_PRELOAD" => nil, "ASAN_OPTIONS" => nil, "UBSAN_OPTIONS" => nil }
    _, err, status = run_command(env, RbConfig.ruby, File.join(ROOT, "ext/strobe/extconf.rb"), chdir: dir, timeout: 300)
    assert status.success?, err
    assert_includes File.read(File.join(dir, "Makefile")), "-DSTROBE_POISON_LEGACY_POSTPONED_JOB"
    out, err, status = run_command(env, "make", "-s", "-j2", chdir: dir, timeout: 300)
    assert status.success?, "#{out}#{err}"[-2000, 2000]
    refute_match(/warning:/, err)
    assert File.exist?(File.join(dir, "strobe.#{RbConfig::CONFIG['DLEXT']}"))
  end

  # Bugs of particular Rubies that profiling can set off are told at start.
  def test_ruby_4_0_fork_bug_is_told_on_the_affected_releases
    %w[4.0.0 4.0.3 4.0.4].each do |version|
      assert_match(/Ruby bug #21959.*4\.0\.5/, Strobe::RubyBugs.warning(:wall, version), version)
      assert_match(/#21959/, Strobe::RubyBugs.warning(:cpu, version), version)
      assert_nil Strobe::RubyBugs.warning(:object, version), "no thread event hooks in object mode"
    end
    %w[3.1.2 3.3.11 3.4.10 4.0.5 4.1.0].each { |version| assert_nil Strobe::RubyBugs.warning(:wall, version), version }
    out, err, status = run_ruby('require "strobe"; Strobe.run(mode: :wall) { 1 }; Strobe.run(mode: :cpu) { 1 }; print :ok')
    assert status.success?
    assert_equal "ok", out
    expected = Strobe::RubyBugs.warning(:wall) ? 1 : 0
    assert_equal expected, err.scan("#21959").size, "told once at most, and only on an affected Ruby: #{err}"
  end
end
