# frozen_string_literal: true

# Downloading a profile for `strobe report URL`: http:// only, with
# timeouts and a cap on its size, into a temporary file.

require_relative "../profile_file"

module Strobe
  class CLI
    # A profile that could not be downloaded; its message says why.
    class DownloadError < StandardError; end

    # A profile at an http:// URL, such as the strobe.json link `strobe serve`
    # prints:
    #
    #   Download.new(url).open { |path| ... }   # raises DownloadError
    class Download
      # What is taken for a URL (https:// too, to refuse it in words).
      URL = %r{\Ahttps?://}i
      # What may be downloaded (the most the profile loader inflates a file
      # to), and how long the server may keep us waiting.
      LIMIT = ProfileFile::MAX_INFLATED
      TIMEOUT = 10

      def self.url?(path)
        path.match?(URL)
      end

      def initialize(url)
        @url = url
      end

      # Downloads the URL into a temporary file and yields its path; the file
      # is removed after. At most LIMIT bytes are taken (the most the profile
      # loader inflates a file to, ProfileFile::MAX_INFLATED), written to the
      # file as they come; the server has TIMEOUT seconds to accept the
      # connection and for each read. Gzip is asked for and kept as it came:
      # the loader's checks of gzipped files apply to it.
      def open
        require "net/http"
        require "tempfile"
        uri = begin
          URI.parse(@url)
        rescue URI::InvalidURIError => e
          raise DownloadError, "not a valid URL (#{e.message})"
        end
        raise DownloadError, "only http:// URLs can be downloaded" if uri.is_a?(URI::HTTPS) || !uri.is_a?(URI::HTTP)
        raise DownloadError, "the URL names no host" if uri.host.to_s.empty?

        Tempfile.create("strobe-download") do |file|
          file.binmode
          fetch(uri, file)
          file.flush
          yield file.path
        end
      end

      private

      def fetch(uri, file)
        Net::HTTP.start(uri.host, uri.port, open_timeout: TIMEOUT, read_timeout: TIMEOUT, write_timeout: TIMEOUT) do |http|
          http.request(Net::HTTP::Get.new(uri, "Accept-Encoding" => "gzip")) do |response|
            raise DownloadError, "HTTP #{response.code} #{response.message}".strip unless response.code == "200"

            encoding = response["content-encoding"].to_s.strip.downcase
            unless ["", "identity", "gzip", "x-gzip"].include?(encoding)
              raise DownloadError, "the server sent it in #{encoding}, not gzip"
            end
            too_large = "larger than #{LIMIT >> 20} MB, the most a profile may be"
            raise DownloadError, too_large if response["content-length"].to_i > LIMIT

            size = 0
            response.read_body do |chunk|
              size += chunk.bytesize
              raise DownloadError, too_large if size > LIMIT

              file.write(chunk)
            end
          end
        end
      rescue Timeout::Error # Net::OpenTimeout, Net::ReadTimeout
        raise DownloadError, "no answer within #{TIMEOUT} s"
      rescue SystemCallError => e
        raise DownloadError, system_reason(e)
      rescue SocketError, IOError, Net::ProtocolError, Net::HTTPBadResponse => e
        raise DownloadError, e.message
      end

      # The reason without the call Ruby adds, as CLI#system_reason words it.
      def system_reason(error)
        error.class < SystemCallError ? error.class.new.message : error.message
      end
    end
  end
end
