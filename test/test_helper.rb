# frozen_string_literal: true

require "minitest/autorun"
require "strobe"
require "rbconfig"
require "open3"
require "timeout"

# Every test runs with compaction after each major GC: profiler tables must
# survive objects moving under them.
GC.auto_compact = true

module StrobeTestHelpers
  ROOT = File.expand_path("..", __dir__)
  LIB = File.join(ROOT, "lib")

  # Runs Ruby code in a child process with Strobe loadable; kills it after
  # timeout seconds. Returns [stdout, stderr, Process::Status].
  def run_ruby(code, timeout: 60, env: {})
    cmd = [RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", "-e", code]
    Open3.popen3(env, *cmd) do |stdin, stdout, stderr, wait|
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      unless wait.join(timeout)
        Process.kill(:KILL, wait.pid)
        flunk "child process did not finish within #{timeout}s:\n#{code}"
      end
      [out.value, err.value, wait.value]
    end
  end

  # Frames of a result by name: {name => frame}. Names must be unique.
  def frames_by_name(result)
    result[:frames].values.to_h { |f| [f[:name], f] }
  end

  def frame_id(result, name)
    ids = result[:frames].select { |_, f| f[:name] == name }.keys
    assert_equal 1, ids.size, "expected one frame named #{name}, got #{ids.size}"
    ids.first
  end
end

class Minitest::Test
  include StrobeTestHelpers

  # A test that fails mid-profile must not leave the next one running.
  def teardown
    return unless Strobe.running?

    Strobe.stop
    Strobe.results
  end
end
